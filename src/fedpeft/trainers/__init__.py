"""How a client improves its adapter locally (the local-trainer axis)."""
