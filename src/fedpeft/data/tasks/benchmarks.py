"""Benchmark tasks read from ``shared/data`` in their original formats (see its README).

Long because it is a catalogue: one short reader per benchmark file, registered side by side so that their
provenance notes and label maps are read together.
"""

from __future__ import annotations

from pathlib import Path

from fedpeft.config import TaskConfig
from fedpeft.data.loaders import read_csv, read_jsonl, read_label_prefixed, read_lines, read_pretrain_json, read_tsv
from fedpeft.data.tasks.base import (
    NLI2_MAP,
    NLI3_MAP,
    PAIR_TEMPLATE,
    SPLIT_SEED,
    TASKS,
    TaskSpec,
    data_folder,
    need_files,
    nli3_spec,
    sentiment_spec,
    stratified_split,
)
from fedpeft.data.types import Example, TaskData

# ---------------------------------------------------------------- GLUE and friends

SST2_SPEC = sentiment_spec("sst2", "review", "the movie")


@TASKS.register("sst2", "SST-2 movie-review sentiment (GLUE); test = dev.tsv")
def load_sst2(cfg: TaskConfig, seed: int) -> TaskData:
    """SST-2: train.tsv for training, the labelled dev.tsv as test (GLUE's test.tsv has no labels)."""
    train_p, dev_p = need_files(data_folder(cfg, "SST-2"), "train.tsv", "dev.tsv", task=cfg.name)
    read = lambda p: read_tsv(p, "sentence", "label")  # noqa: E731
    return SST2_SPEC.build(read(train_p), read(dev_p), source=str(train_p.parent), test_split="dev.tsv")


AGNEWS_CLASSES = ["World", "Sports", "Business", "Sci/Tech"]
AGNEWS_SPEC = TaskSpec(
    name="agnews",
    class_names=AGNEWS_CLASSES,
    label_words=["world", "sports", "business", "tech"],
    label_descriptions=[
        "This news article is about world news, international affairs and politics.",
        "This news article is about sports, games and athletes.",
        "This news article is about business, finance and the economy.",
        "This news article is about science and technology.",
    ],
    template="{text_a} This article is about {mask}.",
    causal_template="Article: {text_a}\nTopic (world, sports, business or tech):",
)


@TASKS.register("agnews", "AG News 4 topics; train = 10k ALPS sample (description only), test = full 7,600")
def load_agnews(cfg: TaskConfig, seed: int) -> TaskData:
    """AG News: the ALPS 10k train sample (description only) and the full test set (title + description)."""
    train_p, test_p = need_files(
        data_folder(cfg, "AGNews"), "train_subset_10k_alps.tsv", "test.csv", task=cfg.name
    )
    names = {name: i for i, name in enumerate(AGNEWS_CLASSES)}
    train = read_tsv(train_p, 0, 1, header=False, label_map=names)
    indices = {str(i + 1): i for i in range(len(AGNEWS_CLASSES))}
    test = read_csv(test_p, ["Title", "Description"], "Class Index", label_map=indices)
    return AGNEWS_SPEC.build(train, test, source=str(train_p.parent), train_text="description only")


RTE_SPEC = TaskSpec(
    name="rte",
    class_names=["entailment", "not_entailment"],
    label_words=["yes", "no"],
    label_descriptions=[
        "The second sentence follows from the first sentence.",
        "The second sentence does not follow from the first sentence.",
    ],
    template=PAIR_TEMPLATE,
    causal_template="Premise: {text_a}\nHypothesis: {text_b}\nDoes the premise entail the hypothesis "
    "(yes or no)? Answer:",
    is_pair=True,
)


@TASKS.register("rte", "RTE textual entailment (GLUE), 2 classes; test = dev.tsv")
def load_rte(cfg: TaskConfig, seed: int) -> TaskData:
    """RTE: train.tsv and the labelled dev.tsv as test."""
    train_p, dev_p = need_files(data_folder(cfg, "RTE"), "train.tsv", "dev.tsv", task=cfg.name)
    read = lambda p: read_tsv(p, "sentence1", "label", "sentence2", label_map=NLI2_MAP)  # noqa: E731
    return RTE_SPEC.build(read(train_p), read(dev_p), source=str(train_p.parent), test_split="dev.tsv")


MRPC_SPEC = TaskSpec(
    name="mrpc",
    class_names=["not_equivalent", "equivalent"],
    label_words=["no", "yes"],
    label_descriptions=[
        "The two sentences have different meanings.",
        "The two sentences mean the same thing.",
    ],
    template=PAIR_TEMPLATE,
    causal_template="Sentence 1: {text_a}\nSentence 2: {text_b}\nDo both sentences mean the same thing "
    "(yes or no)? Answer:",
    is_pair=True,
)


@TASKS.register("mrpc", "MRPC paraphrase detection (GLUE); test = dev.tsv")
def load_mrpc(cfg: TaskConfig, seed: int) -> TaskData:
    """MRPC: train.tsv and dev.tsv (both start with a UTF-8 BOM)."""
    train_p, dev_p = need_files(data_folder(cfg, "MRPC"), "train.tsv", "dev.tsv", task=cfg.name)
    read = lambda p: read_tsv(p, "#1 String", "Quality", "#2 String", encoding="utf-8-sig")  # noqa: E731
    return MRPC_SPEC.build(read(train_p), read(dev_p), source=str(train_p.parent), test_split="dev.tsv")


COLA_SPEC = TaskSpec(
    name="cola",
    class_names=["unacceptable", "acceptable"],
    label_words=["wrong", "correct"],
    label_descriptions=[
        "This sentence is not grammatical English.",
        "This sentence is grammatical English.",
    ],
    template="{text_a} This is {mask}.",
    causal_template="Sentence: {text_a}\nGrammar (wrong or correct):",
)


@TASKS.register("cola", "CoLA grammatical acceptability (GLUE); test = dev.tsv")
def load_cola(cfg: TaskConfig, seed: int) -> TaskData:
    """CoLA: header-less train.tsv/dev.tsv with columns source, label, original mark, sentence."""
    train_p, dev_p = need_files(data_folder(cfg, "CoLA"), "train.tsv", "dev.tsv", task=cfg.name)
    read = lambda p: read_tsv(p, 3, 1, header=False)  # noqa: E731
    return COLA_SPEC.build(read(train_p), read(dev_p), source=str(train_p.parent), test_split="dev.tsv")


QNLI_SPEC = TaskSpec(
    name="qnli",
    class_names=["entailment", "not_entailment"],
    label_words=["yes", "no"],
    label_descriptions=[
        "The sentence answers the question.",
        "The sentence does not answer the question.",
    ],
    template=PAIR_TEMPLATE,
    causal_template="Question: {text_a}\nSentence: {text_b}\nDoes the sentence answer the question "
    "(yes or no)? Answer:",
    is_pair=True,
)


@TASKS.register("qnli", "QNLI question answering NLI (GLUE); train = 9k PowerfulPromptFT sample, test = dev.tsv")
def load_qnli(cfg: TaskConfig, seed: int) -> TaskData:
    """QNLI: the glue_pretrain_train.json sample of GLUE train, and the labelled dev.tsv as test."""
    train_p, dev_p = need_files(data_folder(cfg, "QNLI"), "glue_pretrain_train.json", "dev.tsv", task=cfg.name)
    train = read_pretrain_json(train_p, NLI2_MAP)
    test = read_tsv(dev_p, "question", "label", "sentence", label_map=NLI2_MAP)
    return QNLI_SPEC.build(train, test, source=str(train_p.parent), test_split="dev.tsv")


MNLI_SPEC = nli3_spec("mnli")
SNLI_SPEC = nli3_spec("snli")


@TASKS.register("mnli", "MultiNLI 3-way NLI; train = 9k PowerfulPromptFT sample, test = dev_matched")
def load_mnli(cfg: TaskConfig, seed: int) -> TaskData:
    """MNLI: the glue_pretrain_train.json sample of train, and dev_matched.jsonl as test."""
    train_p, dev_p = need_files(
        data_folder(cfg, "MNLI"), "glue_pretrain_train.json", "dev_matched.jsonl", task=cfg.name
    )
    train = read_pretrain_json(train_p, NLI3_MAP)
    test = read_jsonl(dev_p, "premise", "label", "hypothesis", label_map=NLI3_MAP)
    return MNLI_SPEC.build(train, test, source=str(train_p.parent), test_split="dev_matched.jsonl")


@TASKS.register("snli", "SNLI 3-way NLI; train = 9k PowerfulPromptFT sample, test = dev")
def load_snli(cfg: TaskConfig, seed: int) -> TaskData:
    """SNLI: the glue_pretrain_train.json sample of train, and dev.jsonl as test."""
    train_p, dev_p = need_files(data_folder(cfg, "SNLI"), "glue_pretrain_train.json", "dev.jsonl", task=cfg.name)
    train = read_pretrain_json(train_p, NLI3_MAP)
    test = read_jsonl(dev_p, "premise", "label", "hypothesis", label_map=NLI3_MAP)
    return SNLI_SPEC.build(train, test, source=str(train_p.parent), test_split="dev.jsonl")


BOOLQ_SPEC = TaskSpec(
    name="boolq",
    class_names=["false", "true"],
    label_words=["no", "yes"],
    label_descriptions=[
        "The answer to the question is no.",
        "The answer to the question is yes.",
    ],
    template="{text_a} Question: {text_b}? Answer: {mask}.",
    causal_template="Passage: {text_a}\nQuestion: {text_b}?\nAnswer (yes or no):",
    is_pair=True,
)


@TASKS.register("boolq", "BoolQ yes/no QA (SuperGLUE); train = FewGLUE 32, test = full val (3,270)")
def load_boolq(cfg: TaskConfig, seed: int) -> TaskData:
    """BoolQ: text_a = passage, text_b = question; train.jsonl (32) and val.jsonl as test."""
    train_p, val_p = need_files(data_folder(cfg, "BoolQ"), "train.jsonl", "val.jsonl", task=cfg.name)
    read = lambda p: read_jsonl(p, "passage", "label", "question", label_map={"false": 0, "true": 1})  # noqa: E731
    return BOOLQ_SPEC.build(read(train_p), read(val_p), source=str(train_p.parent), test_split="val.jsonl")


IMDB_SPEC = sentiment_spec("imdb", "review", "the movie")


@TASKS.register("imdb", "IMDB movie-review sentiment; balanced 5k/5k subsets")
def load_imdb(cfg: TaskConfig, seed: int) -> TaskData:
    """IMDB: the 5k train and test subsets; ``<br />`` tags become spaces."""
    train_p, test_p = need_files(
        data_folder(cfg, "IMDB"), "train_subset_5k.jsonl", "test_subset_5k.jsonl", task=cfg.name
    )

    def read(p: Path) -> list[Example]:
        return [
            Example(" ".join(e.text_a.replace("<br />", " ").split()), e.label)
            for e in read_jsonl(p, "text", "label")
        ]

    return IMDB_SPEC.build(read(train_p), read(test_p), source=str(train_p.parent))


MR_SPEC = sentiment_spec("mr", "review", "the movie")


@TASKS.register("mr", "MR movie-review sentence polarity; FedPepTAO train/test split")
def load_mr(cfg: TaskConfig, seed: int) -> TaskData:
    """MR: fedpeptao_split/train.tsv and test.tsv (CRLF line endings)."""
    folder = data_folder(cfg, "MR")
    train_p, test_p = need_files(folder / "fedpeptao_split", "train.tsv", "test.tsv", task=cfg.name)
    read = lambda p: read_tsv(p, "sentence", "label")  # noqa: E731
    return MR_SPEC.build(read(train_p), read(test_p), source=str(folder), split="fedpeptao_split")


MPQA_SPEC = sentiment_spec("mpqa", "phrase")


@TASKS.register("mpqa", "MPQA opinion polarity of phrases; fixed stratified split")
def load_mpqa(cfg: TaskConfig, seed: int) -> TaskData:
    """MPQA: mpqa.neg (label 0) and mpqa.pos (label 1), split by ``test_fraction`` with SPLIT_SEED."""
    neg_p, pos_p = need_files(data_folder(cfg, "MPQA"), "mpqa.neg", "mpqa.pos", task=cfg.name)
    train, test = stratified_split(read_lines(neg_p, 0) + read_lines(pos_p, 1), cfg.test_fraction)
    return MPQA_SPEC.build(train, test, source=str(neg_p.parent), split=f"stratified, seed {SPLIT_SEED}")


YELP_SPEC = sentiment_spec("yelp", "review", "the experience")
YELP_SEEDS = (13, 21, 42, 87, 100)


def _unescape_yelp(text: str) -> str:
    """Yelp texts carry literal ``\\n`` escapes; turn them into spaces."""
    return " ".join(text.replace("\\n", " ").split())


@TASKS.register("yelp", "Yelp polarity; train = 320 rl-prompt few-shot reviews, test = 1k TextFooler sample")
def load_yelp(cfg: TaskConfig, seed: int) -> TaskData:
    """Yelp-P: the unique reviews of all rl-prompt 16-shot files as train, TextFooler's 1k sample as test."""
    folder = data_folder(cfg, "YelpPolarity")
    shots = [f"fewshot_16shot_rlprompt/16-{s}/{split}.tsv" for s in YELP_SEEDS for split in ("train", "dev")]
    *shot_paths, test_p = need_files(folder, *shots, "test_sample_1k_textfooler.txt", task=cfg.name)
    seen: dict[str, Example] = {}
    for p in shot_paths:
        for e in read_tsv(p, "text", "label"):
            seen.setdefault(_unescape_yelp(e.text_a), e)
    train = [Example(text, e.label) for text, e in seen.items()]
    test = [Example(_unescape_yelp(e.text_a), e.label) for e in read_label_prefixed(test_p)]
    return YELP_SPEC.build(train, test, source=str(folder), test_text="lower-cased, tokenized")


NEWSGROUPS_WORDS = {
    "alt.atheism": ("atheist", "atheism and arguments about religion"),
    "comp.graphics": ("graphics", "computer graphics and image software"),
    "comp.os.ms-windows.misc": ("windows", "the Microsoft Windows operating system"),
    "comp.sys.ibm.pc.hardware": ("pc", "IBM PC hardware"),
    "comp.sys.mac.hardware": ("mac", "Apple Macintosh hardware"),
    "comp.windows.x": ("display", "the X Window System on Unix"),
    "misc.forsale": ("sale", "items for sale"),
    "rec.autos": ("cars", "cars and automobiles"),
    "rec.motorcycles": ("bikes", "motorcycles"),
    "rec.sport.baseball": ("baseball", "baseball"),
    "rec.sport.hockey": ("hockey", "ice hockey"),
    "sci.crypt": ("encryption", "cryptography and encryption"),
    "sci.electronics": ("electronics", "electronics and circuits"),
    "sci.med": ("medicine", "medicine and health"),
    "sci.space": ("space", "space exploration and astronomy"),
    "soc.religion.christian": ("church", "Christianity"),
    "talk.politics.guns": ("guns", "guns and gun control"),
    "talk.politics.mideast": ("arab", "politics of the Middle East"),
    "talk.politics.misc": ("politics", "politics"),
    "talk.religion.misc": ("religion", "religion"),
}
NEWSGROUPS_SPEC = TaskSpec(
    name="20ng",
    class_names=list(NEWSGROUPS_WORDS),
    label_words=[w for w, _ in NEWSGROUPS_WORDS.values()],
    label_descriptions=[f"This newsgroup post is about {d}." for _, d in NEWSGROUPS_WORDS.values()],
    template="{text_a} This post is about {mask}.",
    causal_template="Post: {text_a}\nTopic in one word:",
)


@TASKS.register("20ng", "20 Newsgroups (bydate), 20 groups; raw posts with headers")
def load_20ng(cfg: TaskConfig, seed: int) -> TaskData:
    """20 Newsgroups bydate train/test; labels are sklearn's indices (sorted group names)."""
    train_p, test_p = need_files(
        data_folder(cfg, "20Newsgroups"), "20news-bydate-train.jsonl", "20news-bydate-test.jsonl", task=cfg.name
    )
    read = lambda p: read_jsonl(p, "text", "label")  # noqa: E731
    return NEWSGROUPS_SPEC.build(read(train_p), read(test_p), source=str(train_p.parent))


