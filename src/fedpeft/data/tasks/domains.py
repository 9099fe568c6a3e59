"""``sentiment-domains``: binary sentiment over five offline corpora, every example tagged with its domain.

A multi-domain task in the spirit of FDU-MTL (Liu et al. 2017): the domain is each example's ``group``, so
with the ``by_column`` partition scheme (alias ``domains``) each client holds one domain. ``load_task`` applies
``few_shot``/``max_train``/``max_test`` per domain.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from fedpeft.config import ConfigError, TaskConfig
from fedpeft.data.tasks.base import TASKS, TaskLoader, sentiment_spec
from fedpeft.data.tasks.benchmarks import load_imdb, load_mpqa, load_mr, load_sst2, load_yelp
from fedpeft.data.types import Example, TaskData

# domain name -> (its single-domain loader, its folder in shared/data); all label 0 = negative, 1 = positive
SENTIMENT_DOMAINS: dict[str, tuple[TaskLoader, str]] = {
    "imdb": (load_imdb, "IMDB"),
    "mpqa": (load_mpqa, "MPQA"),
    "mr": (load_mr, "MR"),
    "sst2": (load_sst2, "SST-2"),
    "yelp": (load_yelp, "YelpPolarity"),
}
SENTIMENT_DOMAINS_SPEC = sentiment_spec("sentiment-domains", "review")  # sst2's classes, words, descriptions


def chosen_domains(cfg: TaskConfig, known: dict[str, tuple[TaskLoader, str]]) -> list[str]:
    """``task.domains`` sorted and deduplicated (default: all known); ConfigError naming it for an unknown name."""
    names = sorted(set(cfg.domains if cfg.domains is not None else known))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"task.domains: unknown domain(s) {unknown} for task '{cfg.name}'; "
                          f"allowed: {', '.join(sorted(known))}")
    return names


def _tagged(examples: list[Example], domain: str) -> list[Example]:
    return [replace(e, group=domain) for e in examples]


@TASKS.register(
    "sentiment-domains",
    "binary sentiment, one domain per corpus (imdb, mpqa, mr, sst2, yelp; task.domains picks some); "
    "task.max_train/max_test cap each domain's split so the domains stay balanced",
)
def load_sentiment_domains(cfg: TaskConfig, seed: int) -> TaskData:
    """The chosen domains' splits, concatenated in sorted domain order; ``task.path`` is the folder holding theirs."""
    spec = SENTIMENT_DOMAINS_SPEC
    names = chosen_domains(cfg, SENTIMENT_DOMAINS)
    train: list[Example] = []
    test: list[Example] = []
    for name in names:
        loader, folder = SENTIMENT_DOMAINS[name]
        path = None if cfg.path is None else str(Path(cfg.path).expanduser() / folder)
        data = loader(cfg.model_copy(update={"name": name, "path": path}), seed)
        if data.class_names != spec.class_names:  # same label order in every domain, or the labels would mix
            raise ValueError(f"domain '{name}' has classes {data.class_names}, expected {spec.class_names}")
        train += _tagged(data.train, name)
        test += _tagged(data.test, name)
    return spec.build(train, test, domains=",".join(names), caps="few_shot, max_train and max_test are per domain")
