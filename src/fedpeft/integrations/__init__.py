"""Other libraries' training loops as fedpeft clients: ``integrations.transformers`` federates transformers and TRL
trainers (``federate``, ``client_app``)."""
