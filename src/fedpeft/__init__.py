"""fedpeft: federated fine-tuning of frozen language models with parameter-efficient and black-box methods."""

__version__ = "0.1.0"
