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
