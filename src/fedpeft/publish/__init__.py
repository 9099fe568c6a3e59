"""The model leaves the run: ``fedpeft export --format hub`` (a folder for the Hugging Face Hub: the PEFT adapter, a
model card, the training curve and the resolved config; ``--push`` uploads it) and ``fedpeft export --to mlflow``
(the same folder logged to MLflow as a model and registered as a model version).

- ``card``: the model card (``README.md``), its YAML metadata and its body, read from the run directory;
- ``curve``: ``training_curve.png``, loss and accuracy per round from ``metrics.jsonl``;
- ``hub``: writes the folder and pushes it;
- ``mlflow_model``: logs and registers the MLflow model; ``pyfunc_model`` is the file MLflow loads it with.

Everything in the folder is read from the run directory (``config.yaml``, ``model.json``, ``summary.json``,
``metrics.jsonl``, the checkpoint): nothing in a card is typed by hand.
"""
