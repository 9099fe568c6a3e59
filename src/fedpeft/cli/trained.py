"""Using a trained run: ``export`` (PEFT, the Hugging Face Hub, MLflow: ``fedpeft.export``, ``fedpeft.publish``),
``predict``, ``generate`` and ``evaluate`` (a labelled file: class metrics for a classifier, the generation metrics
for a generation run; or a standard suite, ``fedpeft.suites``, of a run or a bare backbone)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from fedpeft.cli.console import console, fail, setup_logging, warn


_CLIENT = typer.Option(help="client K's personalised adapter (methods with private tensors, e.g. FedPepTAO, "
                            "FedSA-LoRA): its id, or its name with natural clients (partition by_column). Without "
                            "it, the global adapter; a run whose sharing keeps every trained tensor on the clients "
                            "(local-only) has no trained global adapter and needs --client; where it keeps part "
                            "(FedSA-LoRA's B, which stays 0 on the server) a warning says the global adapter is "
                            "not what the clients trained")
_MAX_NEW_TOKENS = typer.Option(min=1, help="most tokens per completion (default: the run's "
                                           "evaluation.max_new_tokens)")
_BEST = typer.Option("--best", help="the checkpoint of the best round on the validation split "
                                    "(evaluation.keep_best) instead of the last")


def export(
    run_dir: Annotated[Path, typer.Argument(help="a finished (or checkpointed) run directory")],
    out: Annotated[Optional[Path], typer.Argument(help="output folder (optional with --to mlflow: the hub folder "
                                                       "is then only logged)")] = None,
    format: Annotated[Optional[str], typer.Option(help="peft: a Hugging Face PEFT adapter directory (the default); "
                                                       "hub: the PEFT adapter with a model card (README.md), "
                                                       "training_curve.png and config.yaml, ready for the Hugging "
                                                       "Face Hub")] = None,
    best: Annotated[bool, _BEST] = False,
    client: Annotated[Optional[str], _CLIENT] = None,
    push: Annotated[Optional[str], typer.Option(help="--format hub: upload OUT to this Hugging Face Hub model "
                                                     "repository (e.g. user/my-adapter; created if missing); needs "
                                                     "a token (HF_TOKEN or `hf auth login`) and a network")] = None,
    base_model: Annotated[Optional[str], typer.Option(help="--format hub: the base model's Hub id for the card, "
                                                           "where the run loaded a local folder or a model built in "
                                                           "fedpeft (default: the id the run loaded, or a packaged "
                                                           "model's original)")] = None,
    license: Annotated[Optional[str], typer.Option(help="--format hub: the card's license (a Hub license id, e.g. "
                                                        "apache-2.0; default: the base model's card's, where its "
                                                        "folder has one)")] = None,
    to: Annotated[Optional[str], typer.Option("--to", help="mlflow: log the hub folder to MLflow as a pyfunc model "
                                                           "(predictions by fedpeft's own predict/generate), with "
                                                           "the final metrics, and register a model "
                                                           "version")] = None,
    registered_name: Annotated[Optional[str], typer.Option(help="--to mlflow: the registered model's name "
                                                                "(default: the run's name)")] = None,
    tracking_uri: Annotated[Optional[str], typer.Option(help="--to mlflow: the MLflow tracking URI (default: the "
                                                             "run's mlflow tracking sink's, else "
                                                             "sqlite:///RUN_DIR/mlflow.db)")] = None,
) -> None:
    """Export a run's global adapter (or client K's personalised one) as a PEFT adapter directory
    (PeftModel.from_pretrained(base, OUT) loads it), with the task's classes, readout and templates beside it
    (fedpeft_task.json); --format hub adds a model card, the training curve and the config, and --push uploads it;
    --to mlflow logs it to MLflow as a registered model. A never-trained global adapter (local-only runs) is
    refused: give --client K."""
    from fedpeft.config import ConfigError
    from fedpeft.outputs import check_output_dir, os_error_line

    setup_logging(False)
    hub_only = {"--push": push, "--base-model": base_model, "--license": license}
    if format not in (None, "peft", "hub"):
        fail(f"--format: unknown '{format}'; allowed: peft, hub")
    if to not in (None, "mlflow"):
        fail(f"--to: unknown '{to}'; allowed: mlflow")
    if to is None and (registered_name is not None or tracking_uri is not None):
        fail("--registered-name and --tracking-uri go with --to mlflow")
    if to is not None and format == "peft":
        fail("--to mlflow logs the --format hub folder (adapter, card, curve); drop --format peft")
    hub = format == "hub" or to is not None
    if not hub and any(v is not None for v in hub_only.values()):
        fail(f"{', '.join(k for k, v in hub_only.items() if v is not None)}: go with --format hub")
    if out is None and (to is None or push is not None):
        fail("OUT: give the output folder (only --to mlflow without --push works without one)")
    try:
        if push is not None:
            from fedpeft.publish.hub import check_repo_id

            check_repo_id(push)
        if out is not None:
            check_output_dir(out, "OUT")
        if to is not None:
            from fedpeft.publish.mlflow_model import export_mlflow

            logged = export_mlflow(run_dir, out, best, client, registered_name, tracking_uri, base_model, license)
            note, notes, path = logged.note, logged.warnings, out
        elif hub:
            from fedpeft.publish.hub import export_hub

            written = export_hub(run_dir, out, best, client, base_model, license, push)
            note, notes, path = written.note, written.warnings, written.path
        else:
            from fedpeft.export import export_peft

            path, note = export_peft(run_dir, out, best=best, client=client)
            notes = []
    except (ConfigError, FileNotFoundError, ValueError, ImportError) as e:
        fail(str(e))
    except OSError as e:
        fail(os_error_line(e))
    Console(stderr=True).print(note, highlight=False, markup=False, soft_wrap=True)
    for line in notes:
        warn(line)
    if path is not None:
        console.print(f"wrote {path}", highlight=False, soft_wrap=True)
    if to is not None:
        console.print(f"registered {logged.name} version {logged.version} ({logged.model_uri}, MLflow run "
                      f"{logged.run_id}) at {logged.tracking_uri}", highlight=False, soft_wrap=True)
    if push is not None:
        from fedpeft.publish.hub import PushError, push as upload

        try:
            url = upload(path, push)
        except PushError as e:
            fail(str(e))
        console.print(f"pushed {path} to {push} ({url})", highlight=False, soft_wrap=True)


def _open_model(run_dir: Path, client: Optional[str], best: bool, doing: str = "predicting"):
    """The run's adapter; says on stderr which it is (``doing`` with ...), and warns where the global adapter is
    only partly trained (``TrainedModel.warning``)."""
    from fedpeft.predict import open_model

    setup_logging(False)
    model = open_model(run_dir, client, best)
    Console(stderr=True).print(f"{doing} with {model.describe(with_warning=False)}", highlight=False, markup=False,
                               soft_wrap=True)
    if model.warning:
        warn(model.warning)
    return model


def _say(text: str, style: str = "") -> None:
    """One text as it is, never wrapped at the console's width: soft-wrapped on a terminal, printed plainly
    elsewhere (a file or a pipe gets the lines the model wrote, tabs included)."""
    if console.is_terminal:
        console.print(text, style=style or None, highlight=False, markup=False, soft_wrap=True)
    else:
        print(text, flush=True)


def predict(
    run_dir: Annotated[Path, typer.Argument(help="a finished (or checkpointed) run directory")],
    text: Annotated[list[str], typer.Option("--text", help="a text to classify (repeatable)")] = [],
    file: Annotated[Optional[Path], typer.Option("--file", help="texts: a .csv/.tsv/.jsonl/.parquet file with the "
                                                 "run's text column (or 'text'), or one text per line")] = None,
    client: Annotated[Optional[str], _CLIENT] = None,
    out: Annotated[Optional[Path], typer.Option(help="write OUT.csv or OUT.jsonl (the input's columns, then "
                                                     "'prediction' and one 'p(<class>)' per class) instead of a "
                                                     "table")] = None,
    best: Annotated[bool, _BEST] = False,
) -> None:
    """Labels and class probabilities from a run's global adapter (or client K's personalised one); says which
    round's adapter it is."""
    from rich.markup import escape

    from fedpeft.outputs import check_output_file, os_error_line
    from fedpeft.prediction_files import (OUTPUT_SUFFIXES, prediction_rows, read_inputs, texts_only, write_rows)

    if out is not None and out.suffix.lower() not in OUTPUT_SUFFIXES:
        fail(f"--out: '{out.name}' must end in .csv or .jsonl")
    if not text and file is None:
        fail("no texts to classify: give --text or --file")
    try:
        if out is not None:
            check_output_file(out, "--out")
        model = _open_model(run_dir, client, best)
        inputs = [texts_only(text)] if text else []
        if file is not None:
            inputs.append(read_inputs(file, model.cfg.task))
        rows = []
        for part in inputs:
            probs = model.probabilities(part.examples(model.objective.task.is_pair))
            rows += prediction_rows(part, model.class_names, probs.argmax(-1).tolist(), probs.tolist())
        if out is not None:
            write_rows(rows, out)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    except OSError as e:
        fail(os_error_line(e))
    if out is not None:
        console.print(f"wrote {out} ({len(rows)} texts)", highlight=False)
        return
    table = Table(title=f"{run_dir}" + (f", client {client}" if client is not None else ""))
    columns = list(dict.fromkeys(k for r in rows for k in r))
    for col in columns:
        table.add_column(col, justify="right" if isinstance(rows[0].get(col), float) else "left")
    for r in rows:
        table.add_row(*(f"{r[c]:.3f}" if isinstance(r.get(c), float) else escape(str(r.get(c, ""))) for c in columns))
    console.print(table)


def generate(
    run_dir: Annotated[Path, typer.Argument(help="a generation run's directory (finished or checkpointed)")],
    prompt: Annotated[list[str], typer.Option("--prompt", help="an instruction to complete (repeatable)")] = [],
    file: Annotated[Optional[Path], typer.Option("--file", help="instructions: a .csv/.tsv/.jsonl/.parquet file with "
                                                 "the run's task.instruction_column (and task.input_column where "
                                                 "the run has one; built-in tasks: 'instruction', 'input'), or one "
                                                 "instruction per line")] = None,
    client: Annotated[Optional[str], _CLIENT] = None,
    out: Annotated[Optional[Path], typer.Option(help="write OUT.csv or OUT.jsonl (the input's columns, then "
                                                     "'prompt', as the template frames it, 'prompt_cut', whether "
                                                     "task.max_length cut it, and 'generation') instead of "
                                                     "printing")] = None,
    max_new_tokens: Annotated[Optional[int], _MAX_NEW_TOKENS] = None,
    best: Annotated[bool, _BEST] = False,
) -> None:
    """Greedy completions from a generation run's global adapter (or client K's personalised one), with the
    prompt format the run trained with (the model's chat template, or task.prompt_template); says which round's
    adapter it is."""
    from fedpeft.outputs import check_output_file, os_error_line
    from fedpeft.prediction_files import (OUTPUT_SUFFIXES, generation_rows, instructions_only, read_prompts,
                                          write_rows)

    if out is not None and out.suffix.lower() not in OUTPUT_SUFFIXES:
        fail(f"--out: '{out.name}' must end in .csv or .jsonl")
    if not prompt and file is None:
        fail("no prompts: give --prompt or --file")
    try:
        if out is not None:
            check_output_file(out, "--out")
        model = _open_model(run_dir, client, best, "generating")
        model.language_model()  # a classifier's run: refused before its file is read by generation columns
        inputs = [instructions_only(prompt)] if prompt else []
        if file is not None:
            inputs.append(read_prompts(file, model.cfg.task))
        rows = []
        for part in inputs:
            texts, cuts = model.generate_and_cuts(part.examples, max_new_tokens)
            rows += generation_rows(part, model.prompt_texts(part.examples), cuts, texts)
            if out is None:
                _print_generations(part.examples, cuts, texts, model.cfg.task.max_length)
        if out is not None:
            write_rows(rows, out)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    except OSError as e:
        fail(os_error_line(e))
    if out is not None:
        console.print(f"wrote {out} ({len(rows)} generations)", highlight=False, soft_wrap=True)


def _print_generations(examples: list, cuts: list[bool], texts: list[str], max_length: int) -> None:
    """Each instruction (and input) after '> ', in bold on a terminal, a note where the model read it cut, then its
    completion as written."""
    for example, cut, text in zip(examples, cuts, texts):
        _say(f"> {example.text_a}", "bold")
        if example.text_b:
            _say(f"> {example.text_b}", "bold")
        if cut:
            _say(f"(the model read this prompt cut to task.max_length {max_length}; see task.truncation)")
        _say(text)


def evaluate(
    run_dir: Annotated[Optional[Path], typer.Argument(help="a finished (or checkpointed) run directory (or --model "
                                                           "for a bare backbone)")] = None,
    file: Annotated[Optional[Path], typer.Option("--file", help="a labelled .csv/.tsv/.jsonl/.parquet file: a "
                                                 "classifier's text and label columns (labels are class names or "
                                                 "class indices); a generation run's instruction, input, response "
                                                 "and references columns (as the run reads its data)")] = None,
    suite: Annotated[Optional[str], typer.Option(help="a standard evaluation suite instead of a file: "
                                                      "flowertune-general-nlp (FlowerTune's leaderboard, general "
                                                      "NLP), mmlu, lmeval:boolq, ...; `fedpeft suites` lists "
                                                      "them")] = None,
    limit: Annotated[Optional[int], typer.Option(min=1, help="--suite: a subset: on MMLU, a fixed stratified "
                                                             "draw of this many items of every subject; elsewhere "
                                                             "the first this many items (default: all)")] = None,
    option: Annotated[list[str], typer.Option("--option", help="--suite: one of the suite's settings, KEY=VALUE "
                                                               "(repeatable; e.g. shots=0 for mmlu)")] = [],
    model: Annotated[Optional[str], typer.Option(help="--suite on a bare registered backbone (no run, no "
                                                      "adapter: the zero-shot row), e.g. smollm2")] = None,
    device: Annotated[str, typer.Option(help="--model: where the backbone runs (auto, cpu, cuda)")] = "auto",
    batch_size: Annotated[int, typer.Option(min=1, help="--suite: prompts scored or decoded together")] = 16,
    client: Annotated[Optional[str], _CLIENT] = None,
    out: Annotated[Optional[Path], typer.Option(help="also write the metrics as JSON (a generation run: with each "
                                                     "example's generation, references and scores; a suite: its "
                                                     "scores, and every item's prediction in <out>.items.jsonl)")]
    = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(min=1, help="generation runs: most tokens per "
                                                                      "completion (default: the run's "
                                                                      "evaluation.max_new_tokens)")] = None,
    best: Annotated[bool, _BEST] = False,
) -> None:
    """Score a labelled file: a classifier's accuracy, macro-F1, per-class precision/recall/F1 and confusion
    matrix, or, as a generation run scores its test set, the loss and perplexity per response token
    (teacher-forced) and BLEU, chrF, ROUGE-L and exact match of its greedy completions. With --suite, a standard
    evaluation suite's scores of the run's adapter (or of a bare backbone, --model) by that benchmark's protocol."""
    from fedpeft.outputs import check_output_file, os_error_line

    if (file is None) == (suite is None):
        fail("evaluate: give either --file FILE or --suite NAME")
    if (run_dir is None) == (model is None) and suite is not None:
        fail("evaluate --suite: give a RUN_DIR or --model NAME (a bare backbone), not both")
    if run_dir is None and suite is None:
        fail("evaluate --file: give the RUN_DIR whose adapter scores the file")
    if suite is None and (model is not None or limit is not None or option):
        fail("evaluate: --model, --limit and --option go with --suite")
    try:
        if out is not None:
            check_output_file(out, "--out")
        if suite is not None:
            _suite_scores(run_dir, model, device, suite, limit, option, batch_size, client, best, out)
            return
        trained = _open_model(run_dir, client, best, "evaluating")
        generation = trained.objective.generates
        result = (_generation_scores(trained, file, max_new_tokens) if generation
                  else _class_scores(trained, file))
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    except OSError as e:
        fail(os_error_line(e))
    title = f"{file}: {result['num_examples']:,} examples"
    if generation:
        print_generation_table(result, title)
    else:
        print_class_table(result, trained.class_names, title)
    if out is not None:
        console.print(f"wrote {out}", highlight=False, soft_wrap=True)


def _suite_scores(run_dir: Optional[Path], model: Optional[str], device: str, suite: str, limit: Optional[int],
                  options: list[str], batch_size: int, client: Optional[str], best: bool, out: Optional[Path]) -> None:
    """A standard suite's scores of a run's adapter or a bare backbone, printed (and written with ``out``)."""
    import yaml
    from pydantic import ValidationError

    from fedpeft.predict import bare_model
    from fedpeft.suites import build_suite
    from fedpeft.suites.base import kept_result

    fields = {}
    for opt in options:
        key, eq, value = opt.partition("=")
        if not eq or not key:
            raise ValueError(f"--option {opt!r}: write KEY=VALUE")
        try:
            fields[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise ValueError(f"--option {key.strip()}: the value is not valid YAML ({getattr(e, 'problem', e)})") \
                from None
    try:
        scorer = build_suite(suite, limit, **fields)
    except ValidationError as e:
        raise ValueError(f"--suite {suite}: " + "; ".join(f"--option {'.'.join(map(str, err['loc']))}: {err['msg']}"
                                                          for err in e.errors())) from None
    if model is not None:
        setup_logging(False)
        trained = bare_model(model, device)
        Console(stderr=True).print(f"evaluating {trained.describe()}", highlight=False, markup=False)
    else:
        trained = _open_model(run_dir, client, best, "evaluating")
    if not trained.objective.generates:
        raise ValueError(f"--suite {suite}: scores a causal language model's generations; this run is a classifier")
    result = scorer.run(trained.objective, trained.params, batch_size, progress=console.is_terminal)
    result.protocol["adapter"] = trained.describe()
    table = Table(title=f"{suite}: {result.protocol.get('items', len(result.items)):,} items")
    table.add_column("score")
    table.add_column("value", justify="right")
    for k, v in result.scores.items():
        table.add_row(k, f"{v:.2f}" if isinstance(v, float) else str(v))
    console.print(table)
    if out is not None:
        scores, items = result.write(out)
        console.print(f"wrote {scores} and {items}", highlight=False, soft_wrap=True)
    if run_dir is not None and client is None and not best:  # the global adapter's: fedpeft report shows it
        scores, _ = result.write(kept_result(run_dir, suite))
        console.print(f"kept in {scores}", highlight=False, soft_wrap=True)


def _class_scores(model, file: Path) -> dict:
    """A classifier's metrics of a labelled file, with the file and the adapter."""
    from fedpeft.metrics import confusion, table as metrics_table
    from fedpeft.prediction_files import label_indices, read_inputs

    inputs = read_inputs(file, model.cfg.task, labelled=True)
    labels = label_indices(inputs, model.class_names)
    preds = model.probabilities(inputs.examples(model.objective.task.is_pair)).argmax(-1).tolist()
    result = metrics_table(confusion(labels, preds, len(model.class_names)), model.class_names)
    return result | {"file": str(file), "adapter": model.describe()}


def _generation_scores(model, file: Path, max_new_tokens: Optional[int]) -> dict:
    """A generation run's scores of a labelled file (``TrainedModel.score_generation``), with the file, the adapter,
    the completions' length limit, then each example (where it is in the file included)."""
    from fedpeft.prediction_files import read_prompts

    prompts = read_prompts(file, model.cfg.task, labelled=True)
    result = model.score_generation(prompts.examples, max_new_tokens)
    examples = [e | {"source": where} for e, where in zip(result.pop("examples"), prompts.where)]
    return result | {"file": str(file), "adapter": model.describe(),
                     "max_new_tokens": max_new_tokens or model.cfg.evaluation.max_new_tokens, "examples": examples}


GENERATION_METRICS = (("loss", "loss per response token"), ("perplexity", "perplexity"),
                      ("token_accuracy", "next-token accuracy"), ("bleu", "BLEU"), ("chrf", "chrF"),
                      ("rouge_l", "ROUGE-L"), ("exact_match", "exact match"))


def print_generation_table(result: dict, title: str) -> None:
    """A generation run's scores of a file: teacher-forced loss, perplexity and next-token accuracy, then the
    text metrics of the greedy completions (0-100, ± their bootstrap standard errors where measured)."""
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, name in GENERATION_METRICS:
        value = result.get(key)
        se = result.get(f"{key}_se")
        table.add_row(name, "–" if value is None else f"{value:.4f}" + (f" ± {se:.4f}" if se is not None else ""))
    console.print(table)
    console.print(f"{result['num_tokens']:,} response tokens; completions of up to {result['max_new_tokens']} "
                  "tokens", highlight=False, soft_wrap=True)


def print_class_table(result: dict, class_names: list[str], title: str) -> None:
    """Accuracy and macro-F1, the per-class table and the confusion matrix (rows true, columns predicted)."""
    table = Table(title=title)
    for col in ("class", "precision", "recall", "F1", "support"):
        table.add_column(col, justify="left" if col == "class" else "right")
    for name, m in result["per_class"].items():
        table.add_row(name, f"{m['precision']:.3f}", f"{m['recall']:.3f}", f"{m['f1']:.3f}", f"{m['support']:,}")
    console.print(table)
    cm = Table(title="confusion matrix (rows: true class, columns: predicted)")
    cm.add_column("")
    for name in class_names:
        cm.add_column(name, justify="right")
    for name, row in zip(class_names, result["confusion"]):
        cm.add_row(name, *(f"{v:,}" for v in row))
    console.print(cm)
    f1 = result["macro_f1"]
    console.print(f"accuracy {result['accuracy']:.4f}, macro-F1 " + ("–" if f1 is None else f"{f1:.4f}"),
                  highlight=False)
