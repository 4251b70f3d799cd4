"""The dashboard ``ratchet server`` serves: pages rendered from templates, with small ES
modules and a stylesheet shipped in this package (no build step, no CDN)."""
