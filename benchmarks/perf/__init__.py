"""Performance near the hardware limit (issue 16): each figure is a ratio of two arms measured in this run.

Absolute times move on the shared 2-core machine (other niced jobs run beside it), so every figure alternates
its arms (A B, B A, A B, ...) on one torch thread and reports the median of the per-repetition ratios, with their
range. Figures:

1. Overhead vs the physical limit: one client's epoch of local training (FedPrompt's local work: MiniLM, BBC,
   batch 16, Adam, gradient clipping) by a bare PyTorch loop written here (pre-collated batches, the trainable
   tensors as leaves of a plain forward) against fedpeft's client (``handle_train``: decode the instruction,
   ``client_update``, encode the reply; the client's data view included), for the soft prompt, the deep prompt
   and LoRA; and a whole training round (plan and encode, the clients, decode, validate, aggregate) against the
   sum of its clients' bare loops. Both arms run the same batches from the same start: the trained tensors must
   agree (max |difference| reported). Goal <= 1.05x.
3. Evaluation done once: the global test set and then every client's shard of it (``evaluation.reuse_global:
   false``) against one pass whose predictions are sliced for the clients (the default); the global and local
   metrics and bytes of both must be identical.
5. Black-box batching: (a) lambda candidates of FedBPT's projected prompt in one stacked call against one
   forward per candidate (``method.trainer.batched``), on a client's SST-2 examples; (c) that stacked call with
   its rows sorted by length into one pass per candidate, each padded only to its own longest row (the CPU
   default), against one pass padded to the longest row; (b) SmolLM2's verbalizer readout from the transformer
   body's read row times the LM head (fedpeft) against the whole ``*ForCausalLM`` with full-vocabulary logits at
   every position, gathered afterwards (the old path, emulated here).

4. Scale in one process: FedPrompt on MiniLM with 10, 100 and 1,000 clients of equal work (4 synthetic examples,
   one Adam step; each size in a fresh process; Adam moments kept as every client's persistent state): peak RSS
   beyond the states, and seconds per client-round of the second round, against the 10-client run.
6. Distributed runs: whole FedPrompt runs on a many-client BBC federation (100 clients by default): Flower's
   simulation (one Ray actor per core) against the embedded runtime with one client worker per core
   (``runtime.client_workers``: forked processes sharing the backbone), and the single-process embedded run against
   the same workers. Accuracies per round must agree across the three.
6c. Flower deployment (a SuperLink and two SuperNodes started here, each owning half the clients): a whole run
   with each node's long-lived worker (``node-worker``, the default) against the same run with a model load in
   every ``flwr-clientapp`` process (one per message); backbone loads per run from summary.json, accuracies must
   agree.

2. Vectorised clients: one round's local work of k clients (MiniLM, SST-2) one after another against the same
   clients with their model calls together (``runtime.client_batch: k``, ``backbones.gather``): for forward-only
   methods (FedBPT's CMA-ES, the discrete token search) their black-box forwards in one backbone call per step; for
   a gradient method (FedPrompt's soft prompt, Adam) each step's forward and backward shared, each client with its
   own optimizer; the uploads must agree. The group's stacked rows are sorted by length and cut into k passes
   (``runtime.client_batch_passes: k``), each padded only to its own longest row: on CPU (where the default runs
   the clients one after another, as stacking gains nothing there) the best stacking found, with the same matrix
   sizes as sequential clients, whose population calls sort their own rows (figure 5c). 2a-2c run one torch thread
   at the benchmarks' sizes (16 examples per client; batches of 16); 2s at few-shot sizes (8 examples; batches of
   4, where a small call leaves threads idle) with a torch thread per core in both arms.

8. Start-up (issue 35): ``fedpeft methods``, a YAML syntax error (``fedpeft run bad.yaml``) and ``fedpeft --help``,
   each a fresh process, against a bare ``python -c "import torch"`` (the import that listing and validating no
   longer pay: the heavy libraries are imported on first use, ``fedpeft/lazy.py``). Before the change (the same
   machine, median of 5 ``/usr/bin/time`` runs each): ``methods`` 8.32 s, the YAML error 7.95 s, ``--help`` 0.51 s,
   ``import torch`` 3.08 s, i.e. 2.70x, 2.58x and 0.17x of it; a copy of the code before, timed afterwards
   alternating with the new (5 each): 6.60 -> 1.03 s, 6.83 -> 1.08 s, 0.42 -> 0.38 s (``import torch`` 3.03 s).
   Timed as the environment runs Python (here with ``PYTHONDONTWRITEBYTECODE=1``: fedpeft's modules are compiled
   in every process, as they were before; with bytecode kept, ``methods`` takes about 0.7 s).

9. DPO (issue 73): one ``feddpo`` client's local steps (SmolLM2, LoRA on every linear projection, HH-RLHF pairs
   of at most 128 tokens, batch 4 pairs) against a bare PEFT + PyTorch loop on the same pre-collated batches (the
   policy's and the reference's passes, the reference with the LoRA layers switched off); the trained tensors must
   agree. Goal <= 1.05x.

10. SFT (issue 69's timing fairness): one ``fedit`` client's local steps (SmolLM2, LoRA on every linear projection,
    WebNLG rows of at most 256 tokens, batch 4) against TRL's ``SFTTrainer`` on the same rows in the same order,
    and the same fedpeft client with the LM head at every position (the model run whole, as TRL runs it): three
    arms rotated (A B C, B C A, ...); rows: TRL / fedpeft at equal work, fedpeft at equal work / fedpeft (the
    response-only head's saving), TRL / fedpeft. TRL's steps alone are timed (its setup left out); the trained
    tensors must agree. Module docstring: what each arm does.

Figure 7 (GPU) is a row marked "not measured yet".

Figures 1-5 run one thread each, one after another, or ``--jobs 2`` at a time: each figure's arms still alternate
within its own process, but the other figure's phases (model loads, evaluation passes) hit single repetitions
(figure 1a: 0.89-1.06 alone; 0.87-1.02 and 1.01-1.49 in two runs beside another figure) and figure 4's
sequential runs (4b: 1.05x alone, 1.25x beside another figure); figures 2s, 6 and 6c use every core and run
alone after them, as does 8 (fresh processes timed whole).

Usage (the default size: 25-27 minutes on 2 free cores, measured):
    nice .venv/bin/python -m benchmarks.perf          # figures 1-6, 2s, 6c, 8 -> benchmarks/results/perf.md
    nice .venv/bin/python -m benchmarks.perf --figures 3 5 --reps 5
"""
