"""The decoding profile counts the aten calls one decoding step adds, per side."""

import torch

from benchmarks.generation_perf import profile_decoding


def test_profile_counts_the_aten_calls_of_one_step():
    x = torch.ones(4)

    def steps(calls_per_step):
        def run(n):
            for _ in range(n):
                for _ in range(calls_per_step):
                    torch.add(x, 1)
        return run

    prof = profile_decoding({"one": steps(1), "three": steps(3)}, new_tokens=5, device="cpu")
    one = prof["one"]["aten_calls_per_step"]  # an add and the calls it makes inside (nested calls count too)
    assert one >= 1 and prof["three"]["aten_calls_per_step"] == 3 * one
    assert "aten::add" in prof["three"]["top"]


def test_profile_names_the_ops_one_side_adds_to_a_step():
    x, h = torch.ones(4), torch.ones(3, dtype=torch.float64)

    def run(extra):
        def steps(n):
            for _ in range(n):
                torch.add(x, 1)
                if extra:
                    torch.mul(h, 2)
        return steps

    prof = profile_decoding({"plain": run(False), "more": run(True)}, new_tokens=2, device="cpu")
    diffs = prof["step_op_differences"]
    assert [(d["op"], d["args"], d["plain"], d["more"]) for d in diffs] == \
        [("aten.mul.Tensor", [["torch.float64", (3,), True]], 0, 1)]
