"""Per-round metric records and the run summary (field names are a contract read by benchmarks)."""

from __future__ import annotations

import statistics
from typing import Any

from fedpeft.metrics import per_class

TIMING_FIELDS = ("wall_seconds", "train_seconds", "eval_seconds")


ROLE_FIELDS = ("local_accuracy_P", "local_accuracy_NP", "local_accuracy_global_P", "local_accuracy_global_NP")


def role_means(scored: dict[int, dict[str, Any]], non_participants: frozenset[int]) -> dict[str, float]:
    """Mean local accuracy over participants (P) and non-participants (NP), after post-tuning and, where the
    clients post-tuned, before it (``_global``); only for the roles present."""
    out = {}
    for role, np_role in (("P", False), ("NP", True)):
        group = [m for c, m in scored.items() if (c in non_participants) == np_role]
        if group:
            out[f"local_accuracy_{role}"] = statistics.fmean(m["accuracy"] for m in group)
            if all(m.get("accuracy_global") is not None for m in group):
                out[f"local_accuracy_global_{role}"] = statistics.fmean(m["accuracy_global"] for m in group)
    return out


# generation tasks: perplexity and token counts, loss per natural client (seen/unseen), what the model writes
GENERATION_KEYS = ("perplexity", "num_tokens", "by_group", "seen", "unseen", "generation")
PREFERENCE_KEYS = ("reward_chosen", "reward_rejected", "reward_margin", "logp_chosen", "logp_rejected",
                   "logp_preference", "logp_preference_per_token")  # ``trainers.dpo.pair_metrics``


def local_generation(local_eval: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """``local_generation``: each client's scores of what its own tensors wrote (reply keys ``gen_*``), if any."""
    out = {str(c): {k[4:]: v for k, v in m.items() if k.startswith("gen_")} for c, m in sorted(local_eval.items())}
    out = {c: m for c, m in out.items() if m}
    return {"local_generation": out} if out else {}


def round_record(round: int, global_metrics: dict[str, float], clients: list[dict[str, Any]],
                 local_eval: dict[int, dict[str, Any]], eval_bytes_down: int, wall_seconds: float,
                 non_participants: frozenset[int] = frozenset(), eval_seconds: float = 0.0) -> dict[str, Any]:
    """One ``metrics.jsonl`` line: global test metrics, local accuracy spread, bytes this round, time (the round's
    wall seconds, and the part of them spent evaluating; the rest is training and exchange)."""
    ok = [c for c in clients if c["status"] == "ok"]
    scored = {c: m for c, m in local_eval.items() if m.get("num_examples", 0) > 0}
    local_acc = [m["accuracy"] for m in scored.values()]
    for c in clients:
        if c["client"] in local_eval:
            c["local_accuracy"] = local_eval[c["client"]].get("accuracy")
    return {
        "round": round,
        "accuracy": global_metrics["accuracy"],
        "loss": global_metrics["loss"],
        "macro_f1": global_metrics.get("macro_f1"),
        **({"confusion": global_metrics["confusion"]} if "confusion" in global_metrics else {}),
        **({"asr": global_metrics["asr"]} if "asr" in global_metrics else {}),
        **{k: global_metrics[k] for k in GENERATION_KEYS + PREFERENCE_KEYS + ("suites",) if k in global_metrics},
        **({"local_loss": {str(k): v.get("loss") for k, v in sorted(local_eval.items())}}
           if "perplexity" in global_metrics else {}),
        **local_generation(local_eval),
        "local_accuracy_mean": statistics.fmean(local_acc) if local_acc else None,
        "local_accuracy_min": min(local_acc) if local_acc else None,
        "local_accuracy_max": max(local_acc) if local_acc else None,
        "local_accuracy": {str(k): v.get("accuracy") for k, v in sorted(local_eval.items())},
        **role_means(scored, non_participants),
        "bytes_up": sum(c["bytes_up"] for c in clients),
        "bytes_down": sum(c["bytes_down"] for c in clients),
        "eval_bytes_down": eval_bytes_down,
        "eval_bytes_up": sum(int(v.get("bytes_up", 0)) for v in local_eval.values()),
        "num_selected": len(clients),
        "num_ok": len(ok),
        "num_failed": sum(c["status"] == "failed" for c in clients),
        "num_rejected": sum(c["status"] == "rejected" for c in clients),
        "train_loss": statistics.fmean(c["train_loss"] for c in ok) if ok and "train_loss" in ok[0] else None,
        "clients": clients,
        "wall_seconds": wall_seconds,
        "eval_seconds": eval_seconds,
    }


HEADLINE = ("bleu", "chrf", "rouge_l", "exact_match")  # a generation run's own metrics, its summary leads with


def final_generation(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The scores of what the final round's global model wrote (``HEADLINE`` with their bootstrap standard errors,
    the number of test prompts decoded and the round), or None where the last round decoded nothing
    (``evaluation.generate_every: 0``)."""
    last = records[-1] if records else None
    g = (last or {}).get("generation")
    if not g:
        return None
    return {"round": last["round"], "num_generated": g.get("num_generated"),
            **{k: g[k] for m in HEADLINE for k in (m, f"{m}_se") if k in g}}


def validation_score(rec: dict[str, Any], generation: bool) -> float | None:
    """``evaluation.keep_best``'s score of a round (higher is better): its validation accuracy; on a generation task
    minus its validation loss per response token (next-token accuracy rewards short, generic responses)."""
    if generation:
        return -rec["val_loss"] if rec.get("val_loss") is not None else None
    return rec.get("val_accuracy")


def build_summary(identity: dict[str, Any], records: list[dict[str, Any]], trainable_params: int,
                  backbone_params: int, extra: dict[str, Any]) -> dict[str, Any]:
    """Totals over the run, after ``identity`` (the run's method, task, model, runtime and seed);
    ``upload_ratio_vs_full`` compares with sending every backbone weight in fp32."""
    accs = [r["accuracy"] for r in records if r["accuracy"] is not None and r["round"] > 0]
    initial = next((r for r in records if r["round"] == 0), None)
    up = sum(r["bytes_up"] for r in records)
    down = sum(r["bytes_down"] for r in records)
    client_rounds = sum(r["num_ok"] + r["num_rejected"] for r in records) or 1
    sent = sum(r["num_selected"] for r in records) or 1
    per_client_up = up / client_rounds
    full_bytes = 4 * backbone_params
    scored = next((r for r in reversed(records) if r.get("confusion") is not None), None)
    names = extra.get("class_names")
    generation = any(r.get("perplexity") is not None for r in records)  # generation records carry perplexity
    validated = [r for r in records if validation_score(r, generation) is not None]
    best = max(validated, key=lambda r: validation_score(r, generation)) if validated else None  # earliest of ties
    chosen = ({"best_round": best["round"], "best_val_accuracy": best.get("val_accuracy"),
               "best_val_loss": best.get("val_loss"), "accuracy_at_best_round": best["accuracy"]}
              if best is not None else {})
    classes = ({"confusion_round": scored["round"], "macro_f1": scored.get("macro_f1"),
                "confusion": scored["confusion"], "per_class": per_class(scored["confusion"], names)}
               if scored is not None and names else {})
    return {
        **identity,
        "rounds": sum(r["round"] > 0 for r in records),
        "initial_accuracy": initial["accuracy"] if initial else None,
        "final_accuracy": records[-1]["accuracy"] if records else None,
        "best_accuracy": max(accs) if accs else None,
        "final_loss": records[-1]["loss"] if records else None,
        "final_macro_f1": records[-1].get("macro_f1") if records else None,
        **({"final_asr": records[-1]["asr"]} if records and "asr" in records[-1] else {}),
        "final_local_accuracy_mean": records[-1]["local_accuracy_mean"] if records else None,
        **({"final_perplexity": records[-1].get("perplexity"), "final_generation": final_generation(records)}
           if generation else {}),
        **{f"final_{k}": records[-1].get(k) for k in ROLE_FIELDS if records and k in records[-1]},
        "bytes_up_total": up,
        "bytes_down_total": down,
        "bytes_up_per_client_round": per_client_up,
        "bytes_down_per_client_round": down / sent,
        "eval_bytes_total": sum(r["eval_bytes_down"] + r["eval_bytes_up"] for r in records),
        "trainable_params": trainable_params,
        "backbone_params": backbone_params,
        "full_model_bytes_fp32": full_bytes,
        "upload_ratio_vs_full": per_client_up / full_bytes,
        "wall_seconds": sum(r["wall_seconds"] for r in records),
        **extra,
        **classes,
        **chosen,
    } | ({"upload_framing_bytes": per_client_up - extra["upload_tensor_bytes"]}
         if "upload_tensor_bytes" in extra else {})
