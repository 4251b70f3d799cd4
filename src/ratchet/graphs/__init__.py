"""Graph workflows: a YAML/JSON graph of nodes, validated by pydantic, registered by
content, and run by an interpreter whose nodes are steps of the one engine."""

from ratchet.graphs.model import NODE_TYPES, json_schema
from ratchet.graphs.validate import Graph, GraphInvalid, Problem, load, load_document, validate

__all__ = ["NODE_TYPES", "Graph", "GraphInvalid", "Problem", "json_schema", "load",
           "load_document", "validate"]
