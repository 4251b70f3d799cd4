"""Effects on the outside world, delivered once."""
