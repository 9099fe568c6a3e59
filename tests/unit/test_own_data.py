"""Bring your own data: csv/tsv/jsonl/parquet tasks, readout overrides from the config, and by_column partitions."""

from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedpeft.model.classifier import Classifier
from fedpeft.backbones.loading import load_backbone
from fedpeft.config import ConfigError, ExperimentConfig, TaskConfig
from fedpeft.data import OTHER_GROUP, load_task, partition, pool_small_groups
from fedpeft.data.participants import non_participants
from fedpeft.data.tasks.base import PAIR_TEMPLATE
from fedpeft.experiment import split_clients
from fedpeft.resolve import load_config

COLUMNS = ["premise", "hypothesis", "answer", "site"]


def write(path: Path, rows: list[dict], fmt: str | None = None) -> Path:
    """Write ``rows`` (dicts) as csv, tsv, jsonl or parquet, by ``fmt`` or the file's extension."""
    fmt = fmt or path.suffix[1:]
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif fmt == "parquet":
        pd.DataFrame(rows).to_parquet(path)
    else:
        with path.open("w", newline="", encoding="utf-8") as f:
            quoting = csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL
            w = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t" if fmt == "tsv" else ",", quoting=quoting)
            w.writeheader()
            w.writerows(rows)
    return path


def pair_rows(n: int, offset: int = 0) -> list[dict]:
    """Sentence pairs labelled yes/no, each from one of three sites (a: 50%, b: 30%, c: 20%)."""
    sites = ["a"] * 5 + ["b"] * 3 + ["c"] * 2
    return [{"premise": f"the cat, number {i} sat", "hypothesis": f"a cat sat {i}",
             "answer": "yes" if i % 2 else "no", "site": sites[i % 10]} for i in range(offset, offset + n)]


def text_rows(labels: list[object], groups: list[str] | None = None) -> list[dict]:
    rows = [{"text": f"example {i}", "label": y} for i, y in enumerate(labels)]
    for r, g in zip(rows, groups or [], strict=False):
        r["user"] = g
    return rows


def task_cfg(path: Path, name: str | None = None, **kw: object) -> TaskConfig:
    return TaskConfig(name=name or path.suffix[1:] or "csv", path=str(path), **kw)


# ---------------------------------------------------------------- formats


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "parquet"])
def test_each_format_reads_pairs_with_string_labels(tmp_path: Path, fmt: str) -> None:
    write(tmp_path / f"train.{fmt}", pair_rows(20))
    write(tmp_path / f"test.{fmt}", pair_rows(10, offset=100))
    cfg = TaskConfig(name=fmt, path=str(tmp_path), text_column="premise", text_pair_column="hypothesis",
                     label_column="answer")
    data = load_task(cfg, 0)
    assert data.class_names == ["no", "yes"] and data.label_words == ["no", "yes"]
    assert data.is_pair and data.template == PAIR_TEMPLATE and "{text_b}" in data.causal_template
    assert len(data.train) == 20 and len(data.test) == 10
    first = data.train[1]
    assert (first.text_a, first.text_b, first.label, first.group) == ("the cat, number 1 sat", "a cat sat 1", 1, None)
    assert data.test[0].text_a == "the cat, number 100 sat" and data.test[0].label == 0
    assert load_task(cfg, 5).train == data.train  # reading is deterministic


def test_single_file_gets_a_seeded_stratified_split(tmp_path: Path) -> None:
    path = write(tmp_path / "my.csv", text_rows(["pos"] * 30 + ["neg"] * 20))
    cfg = task_cfg(path, test_fraction=0.2)
    a, b = load_task(cfg, 0), load_task(cfg, 7)
    assert len(a.train) == 40 and len(a.test) == 10
    assert sorted(e.label for e in a.test) == [0] * 4 + [1] * 6  # stratified: neg 4, pos 6
    assert a.test == b.test  # the split does not depend on the experiment seed
    assert {e.text_a for e in a.train} | {e.text_a for e in a.test} == {f"example {i}" for i in range(50)}


def test_test_path_gives_the_test_file(tmp_path: Path) -> None:
    train = write(tmp_path / "a.jsonl", text_rows(["x", "y"] * 5))
    test = write(tmp_path / "b.jsonl", text_rows(["y", "x", "x"]))
    data = load_task(task_cfg(train, test_path=str(test)), 0)
    assert len(data.train) == 10 and [e.label for e in data.test] == [1, 0, 0]


def test_integer_labels_sort_numerically_and_label_names_set_the_order(tmp_path: Path) -> None:
    path = write(tmp_path / "n.csv", text_rows([10, 2, 2, 10, 7, 7]))
    data = load_task(task_cfg(path, test_path=str(path)), 0)
    assert data.class_names == ["2", "7", "10"] and [e.label for e in data.train] == [2, 0, 0, 2, 1, 1]
    named = write(tmp_path / "s.csv", text_rows(["pos", "neg", "neutral"] * 2))
    data = load_task(task_cfg(named, test_path=str(named), label_names=["neg", "neutral", "pos", "mixed"]), 0)
    assert data.class_names == ["neg", "neutral", "pos", "mixed"] and data.train[0].label == 2
    ints = write(tmp_path / "i.jsonl", text_rows([0, 1, 1, 0]))
    data = load_task(task_cfg(ints, test_path=str(ints), label_names=["bad", "good"]), 0)
    assert data.class_names == ["bad", "good"] and [e.label for e in data.train] == [0, 1, 1, 0]
    assert data.label_words == ["bad", "good"]
    with pytest.raises(ConfigError, match=r"task.label_names: labels \['maybe'\]"):
        load_task(task_cfg(write(tmp_path / "u.csv", text_rows(["yes", "no", "maybe"])), label_names=["no", "yes"]), 0)


# ---------------------------------------------------------------- errors


def test_a_missing_relative_path_is_named_with_where_it_was_looked_for(tmp_path: Path, monkeypatch) -> None:
    """Relative paths are read from the working directory (not the config's folder): the error says so and prints
    the absolute path it tried."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_task(TaskConfig(name="csv", path="data/nowhere.csv"), 0)
    assert str(err.value).startswith("task.path: file not found: data/nowhere.csv")
    assert f"read from the working directory: {tmp_path / 'data' / 'nowhere.csv'}" in str(err.value)


def test_missing_file_and_folder_without_train_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"task.path: file not found: .*nowhere.csv"):
        load_task(TaskConfig(name="csv", path=str(tmp_path / "nowhere.csv")), 0)
    with pytest.raises(ConfigError, match=r"task.path: folder .* has no train.tsv"):
        load_task(TaskConfig(name="tsv", path=str(tmp_path)), 0)
    with pytest.raises(ConfigError, match="task.path: task 'csv' needs task.path"):
        load_task(TaskConfig(name="csv"), 0)
    path = write(tmp_path / "ok.csv", text_rows(["a", "b"] * 3))
    with pytest.raises(ConfigError, match=r"task.path: file not found: .*gone.csv"):
        load_task(task_cfg(path, test_path=str(tmp_path / "gone.csv")), 0)


@pytest.mark.parametrize(("key", "field"), [("text_column", "task.text_column"),
                                            ("label_column", "task.label_column"),
                                            ("text_pair_column", "task.text_pair_column")])
def test_missing_column_names_the_field_and_lists_the_columns(tmp_path: Path, key: str, field: str) -> None:
    path = write(tmp_path / "d.csv", text_rows(["a", "b"]))
    with pytest.raises(ConfigError) as info:
        load_task(task_cfg(path, **{key: "nope"}), 0)
    assert str(info.value).startswith(f"{field}: column 'nope' not found in {path}; columns found: text, label")


def test_missing_group_column_names_partition_column(tmp_path: Path) -> None:
    path = write(tmp_path / "d.parquet", text_rows(["a", "b"] * 3))
    with pytest.raises(ConfigError, match=r"federation.partition.column: column 'user' not found in .*d.parquet; "
                                          "columns found: text, label"):
        load_task(task_cfg(path), 0, group_column="user")


@pytest.mark.parametrize("content", ["", "text,label\n", "\n\n"])
def test_empty_file_is_an_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "e.csv"
    path.write_text(content)
    with pytest.raises(ConfigError, match=r"task.path: .*e.csv (is empty|has no data rows)"):
        load_task(task_cfg(path), 0)
    (tmp_path / "e.jsonl").write_text(content.replace("text,label", ""))
    with pytest.raises(ConfigError, match=r"task.path: .*e.jsonl has no data rows"):
        load_task(task_cfg(tmp_path / "e.jsonl"), 0)


def test_unlabelled_row_names_its_line(tmp_path: Path) -> None:
    csv_path = tmp_path / "u.csv"
    csv_path.write_text('text,label\nfine,a\n"two\nlines",b\n\nno label here,\nlast,a\n')
    with pytest.raises(ConfigError, match=r"task.label_column: .*u.csv line 6 has no label in column 'label'"):
        load_task(task_cfg(csv_path), 0)
    jsonl = write(tmp_path / "u.jsonl", [{"text": "a", "label": "x"}, {"text": "b"}, {"text": "c", "label": "y"}])
    with pytest.raises(ConfigError, match=r"task.label_column: .*u.jsonl line 2 has no label"):
        load_task(task_cfg(jsonl), 0)
    parquet = write(tmp_path / "u.parquet", [{"text": "a", "label": 1.0}, {"text": "b", "label": None},
                                              {"text": "c", "label": 0.0}])
    with pytest.raises(ConfigError, match=r"task.label_column: .*u.parquet row 2 has no label"):
        load_task(task_cfg(parquet), 0)
    tsv = tmp_path / "t.tsv"
    tsv.write_text("text\tlabel\n\tpos\nsecond\tneg\n")  # an empty text is kept, only a missing label is an error
    assert load_task(task_cfg(tsv, test_path=str(tsv)), 0).train[0].text_a == ""


def test_one_class_only_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "one.csv", text_rows(["pos"] * 6))
    with pytest.raises(ConfigError, match=r"task.label_column: .*one.csv has a single class \('pos'\)"):
        load_task(task_cfg(path), 0)


def test_non_utf8_file_says_to_set_the_encoding(tmp_path: Path) -> None:
    path = tmp_path / "latin.csv"
    path.write_bytes("text,label\ncafé crème,a\nthé,b\nok,a\nfine,b\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"task.encoding: .*latin.csv is not valid utf-8 .*set task.encoding"):
        load_task(task_cfg(path), 0)
    jsonl = tmp_path / "latin.jsonl"
    jsonl.write_bytes('{"text": "ok", "label": 1}\n{"text": "café", "label": 0}\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"task.encoding: .*latin.jsonl line 2 is not valid utf-8"):
        load_task(task_cfg(jsonl), 0)
    data = load_task(task_cfg(path, encoding="latin-1", test_path=str(path)), 0)
    assert data.train[0].text_a == "café crème"


def test_unknown_encoding_names_the_field(tmp_path: Path) -> None:
    path = write(tmp_path / "x.csv", text_rows(["a", "b"]))
    with pytest.raises(ConfigError, match="task.encoding: unknown encoding 'klingon'"):
        load_task(task_cfg(path, encoding="klingon"), 0)


def test_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes("text,label\nx,a\ny,b\n".encode("utf-8-sig"))
    assert load_task(task_cfg(path, test_path=str(path)), 0).class_names == ["a", "b"]


def test_label_words_with_one_first_token_name_the_field(tmp_path: Path) -> None:
    path = write(tmp_path / "z.csv", text_rows(["a", "b"] * 4))
    data = load_task(task_cfg(path, label_words=["zebra", "zebras"]), 0)
    backbone = load_backbone("tiny-bert-mlm")
    from fedpeft.adapters import ADAPTERS

    adapter = ADAPTERS.get("soft_prompt")(ADAPTERS.settings_of(ExperimentConfig().method.adapter))
    with pytest.raises(ValueError, match=r"task.label_words: .*\['zebra', 'zebras'\] share a first token"):
        Classifier(backbone, adapter, data, "verbalizer")


@pytest.mark.parametrize(("kw", "message"), [
    ({"label_words": ["a", "b", "c"]}, r"task.label_words: 3 given for the 2 classes \['negative', 'positive'\]"),
    ({"label_descriptions": ["x", "y", "z"]}, "task.label_descriptions: 3 given for the 2 classes"),
    ({"template": "{text_a} is it?"}, r"task.template '\{text_a\} is it\?' lacks \{mask\}"),
    ({"causal_template": "Answer:"}, r"task.causal_template 'Answer:' lacks \{text_a\}"),
    ({"encoding": "latin-1"}, "task.encoding applies to the file tasks"),
    ({"text_column": "review"}, "task.text_column applies to the file tasks"),
])
def test_bad_readout_or_file_keys_name_the_field(kw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_task(TaskConfig(name="synthetic-sentiment", num_examples=40, **kw), 0)


def test_pair_templates_need_text_b(tmp_path: Path) -> None:
    write(tmp_path / "train.csv", pair_rows(10))
    cfg = TaskConfig(name="csv", path=str(tmp_path), text_column="premise", text_pair_column="hypothesis",
                     label_column="answer", template="{text_a} {mask}")
    with pytest.raises(ConfigError, match=r"task.template .* lacks \{text_b\}"):
        load_task(cfg, 0)


def test_partition_column_applies_to_file_tasks_and_by_column_only() -> None:
    with pytest.raises(ConfigError, match="federation.partition.column: task 'synthetic-sentiment' has no column"):
        load_task(TaskConfig(name="synthetic-sentiment", num_examples=40), 0, group_column="user")
    with pytest.raises(ConfigError, match="partition.column needs partition.scheme 'by_column'"):
        load_config(None, ["federation.partition.column=user"])


# ---------------------------------------------------------------- readout overrides from the config


def test_yaml_overrides_label_words_and_templates_of_a_builtin_task(tmp_path: Path) -> None:
    yaml_path = tmp_path / "exp.yaml"
    yaml_path.write_text("task:\n  name: synthetic-sentiment\n  num_examples: 40\n  label_words: [awful, super]\n"
                         "  label_descriptions: [It is awful., It is super.]\n"
                         "  template: 'Review: {text_a} Verdict: {mask}'\n  causal_template: '{text_a} =>'\n")
    cfg = load_config(yaml_path, [])
    data = load_task(cfg.task, 0)
    assert data.label_words == ["awful", "super"] and data.label_descriptions == ["It is awful.", "It is super."]
    assert data.template == "Review: {text_a} Verdict: {mask}" and data.causal_template == "{text_a} =>"


def test_custom_template_shows_up_in_the_encoded_tokens(tiny_cfg, tmp_path: Path) -> None:  # noqa: ANN001
    from fedpeft.experiment import build_experiment

    path = write(tmp_path / "my.csv", text_rows(["neg", "pos"] * 10))
    exp = build_experiment(tiny_cfg(task__name="csv", task__path=str(path), task__num_examples=None,
                                    model__name="tiny-bert-mlm", federation__num_clients=2,
                                    task__template="'{text_a} zebra verdict: {mask} .'",
                                    task__label_words="[terrible, wonderful]"))
    tok = exp.backbone.tokenizer
    tokens = tok.convert_ids_to_tokens(exp.test_encoded.input_ids[0])
    assert "zebra" in tokens and "verdict" in tokens and tok.mask_token in tokens
    assert exp.objective.label_ids.tolist() == tok.convert_tokens_to_ids(["terrible", "wonderful"])


# ---------------------------------------------------------------- by_column


def by_column_cfg(num_clients: int, column: str = "user", seed: int = 0, **partition_kw: object) -> ExperimentConfig:
    return ExperimentConfig.model_validate({"seed": seed, "federation": {
        "num_clients": num_clients, "partition": {"scheme": "by_column", "column": column, **partition_kw}}})


def users_task(tmp_path: Path, counts: dict[str, int]):  # noqa: ANN201
    """A csv task whose train and test files hold ``counts[u]`` rows of user ``u`` each."""
    users = [u for u, n in counts.items() for _ in range(n)]
    labels = ["neg", "pos"] * (len(users) // 2 + 1)
    write(tmp_path / "train.csv", text_rows(labels[: len(users)], users))
    write(tmp_path / "test.csv", text_rows(labels[: len(users)], users))
    return load_task(TaskConfig(name="csv", path=str(tmp_path)), 0, group_column="user")


def test_by_column_gives_one_client_per_value_in_sorted_order(tmp_path: Path) -> None:
    task = users_task(tmp_path, {"zoe": 6, "al": 4, "mo": 8})
    train, test, groups = split_clients(task, by_column_cfg(3))
    assert groups == ["al", "mo", "zoe"]
    for k, g in enumerate(groups):
        assert {task.train[i].group for i in train[k]} == {g} and {task.test[i].group for i in test[k]} == {g}
        assert train[k].size == test[k].size == {"al": 4, "mo": 8, "zoe": 6}[g]
    again = split_clients(task, by_column_cfg(3, seed=9))
    assert again[2] == groups and all(np.array_equal(a, b) for a, b in zip(train, again[0], strict=True))


def test_by_column_pools_values_below_min_size_into_one_last_client(tmp_path: Path) -> None:
    task = users_task(tmp_path, {"b": 5, "a": 1, "c": 2, "d": 6, "e": 1})
    train, test, groups = split_clients(task, by_column_cfg(3, min_size=3))
    assert groups == ["b", "d", OTHER_GROUP]
    assert {task.train[i].group for i in train[2]} == {"a", "c", "e"}
    assert {task.test[i].group for i in test[2]} == {"a", "c", "e"}  # the test split follows the pooling
    assert np.array_equal(np.sort(np.concatenate(train)), np.arange(len(task.train)))
    with pytest.raises(ConfigError, match=r"federation.num_clients must be 3 for the 'by_column' scheme \(3 values "
                                          r"of column 'user', those under .* pooled into '<other>'.*got 5"):
        split_clients(task, by_column_cfg(5, min_size=3))
    # two IID clients per group: a value needs min_size x clients_per_domain = 6 rows for clients of its own
    _, _, groups = split_clients(task, by_column_cfg(4, min_size=3, clients_per_domain=2))
    assert groups == ["d", "d", OTHER_GROUP, OTHER_GROUP]


def test_pool_small_groups_is_idempotent_and_pools_unseen_test_values() -> None:
    train = np.array(["a", "a", "b", "c", "c", "c"])
    pooled, test = pool_small_groups(2, train, np.array(["b", "z", "c"]))
    assert pooled.tolist() == ["a", "a", OTHER_GROUP, "c", "c", "c"] and test.tolist() == [OTHER_GROUP] * 2 + ["c"]
    assert pool_small_groups(2, pooled)[0].tolist() == pooled.tolist()


def test_domains_is_an_alias_of_by_column(tmp_path: Path) -> None:
    task = users_task(tmp_path, {"x": 4, "y": 4})
    labels = np.array([e.label for e in task.train])
    groups = np.array([e.group for e in task.train])
    a = partition(labels, 2, by_column_cfg(2).federation.partition, np.random.default_rng(1), groups)
    alias = ExperimentConfig.model_validate({"federation": {"num_clients": 2, "partition": {
        "scheme": "domains", "column": "user"}}}).federation.partition
    b = partition(labels, 2, alias, np.random.default_rng(1), groups)
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))


def test_by_column_needs_a_column_or_a_grouped_task(tmp_path: Path) -> None:
    path = write(tmp_path / "plain.csv", text_rows(["a", "b"] * 4))
    task = load_task(task_cfg(path), 0)
    cfg = ExperimentConfig.model_validate({"federation": {"num_clients": 2, "partition": {"scheme": "by_column"}}})
    with pytest.raises(ConfigError, match="needs federation.partition.column"):
        split_clients(task, cfg)


def test_fold_non_participants_work_on_file_groups(tmp_path: Path) -> None:
    task = users_task(tmp_path, {"h1": 4, "h2": 4, "h3": 4, "h4": 4})
    _, _, groups = split_clients(task, by_column_cfg(4, column="user"))
    cfg = ExperimentConfig.model_validate({"federation": {"num_clients": 4, "partition": {
        "scheme": "by_column", "column": "user"}, "non_participants": {"fold": 1, "folds": 2}}})
    assert non_participants(cfg.federation.non_participants, 4, 0, groups) == {2, 3}


def test_max_train_is_global_for_file_tasks(tmp_path: Path) -> None:
    write(tmp_path / "train.csv", text_rows(["neg", "pos"] * 20, ["u1"] * 30 + ["u2"] * 10))
    cfg = TaskConfig(name="csv", path=str(tmp_path), max_train=10)
    assert len(load_task(cfg, 0, group_column="user").train) == 10


# ---------------------------------------------------------------- end to end


def test_one_round_on_a_csv_end_to_end(tiny_cfg, tmp_path: Path, one_thread) -> None:  # noqa: ANN001
    from fedpeft.runtime.embedded import run_embedded

    users = ["ann", "bob", "cy"] * 12
    rows = [{"review": f"{'great fun' if i % 2 else 'dull and slow'} {i}", "stars": "good" if i % 2 else "bad",
             "user": u} for i, u in enumerate(users)]
    path = write(tmp_path / "my.csv", rows)
    cfg = tiny_cfg(task__name="csv", task__path=str(path), task__num_examples=None, task__text_column="review",
                   task__label_column="stars", federation__rounds=1, federation__partition__scheme="by_column",
                   federation__partition__column="user")
    summary = run_embedded(cfg, tmp_path / "run")
    assert summary["rounds"] == 1 and summary["task"] == "csv" and 0.0 <= summary["final_accuracy"] <= 1.0


# ---------------------------------------------------------------- labels that must not become classes (issue 35)


@pytest.mark.parametrize("missing", ["NaN", "nan", "None", "null", "NULL", "n/a"])
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_labels_that_read_as_missing_are_refused_at_their_line(tmp_path: Path, fmt: str, missing: str) -> None:
    path = write(tmp_path / f"m.{fmt}", text_rows(["pos", "neg", missing, "pos", "neg"]))
    line = 4 if fmt == "csv" else 3  # below the CSV header
    with pytest.raises(ConfigError, match=rf"task.label_column: .*m.{fmt} line {line} has '{missing}' in column "
                                          r"'label', which reads as a missing value"):
        load_task(task_cfg(path), 0)


def test_a_stray_value_among_class_names_is_named_in_a_warning(tmp_path: Path) -> None:
    labels = ["pos", "neg"] * 10
    labels[7] = "2"  # a stray integer among string labels became a class of its own, silently
    path = write(tmp_path / "s.csv", text_rows(labels))
    with pytest.warns(UserWarning, match=r"classes with fewer than 5 rows .*'2': 1 row \(.*s.csv line 9\)"):
        data = load_task(task_cfg(path), 0)
    assert data.class_names == ["2", "neg", "pos"]  # still a class (the user decides), but never silently
    with warnings.catch_warnings():  # classes named in task.label_names are what the user asked for: no warning
        warnings.simplefilter("error")
        load_task(task_cfg(write(tmp_path / "ok.csv", text_rows(["pos", "neg"] * 10)), label_names=["neg", "pos"]), 0)


@pytest.mark.parametrize("readout", ["similarity", "linear", "verbalizer"])
def test_colliding_label_words_are_an_error_for_every_readout(tmp_path: Path, readout: str) -> None:
    path = write(tmp_path / "w.csv", text_rows(["pos", "neg"] * 5))
    cfg = load_config(None, ["task.name=csv", f"task.path={path}", "task.label_words=[Good, good]",
                             "model.name=tiny-llama" if readout == "verbalizer" else "model.name=tiny-bert",
                             f"model.readout={readout}"])
    with pytest.raises(ConfigError, match=r"task.label_words: classes 'neg' and 'pos' share 'good'"):
        load_task(cfg.task, 0)


def test_default_label_words_of_file_classes_are_distinct(tmp_path: Path) -> None:
    path = write(tmp_path / "v.csv", text_rows(["very good", "very bad", "okay"] * 4))
    data = load_task(task_cfg(path), 0)
    assert data.class_names == ["okay", "very bad", "very good"]
    assert data.label_words == ["okay", "bad", "good"]  # first words collide ('very'): the last words
