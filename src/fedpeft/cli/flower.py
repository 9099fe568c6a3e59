"""``fedpeft flower ...``: the Flower operations (SuperLink, SuperNodes, certificates, node keys, submitting runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from fedpeft.cli.console import console, fail, print_summary, run_dir, warn

app = typer.Typer(no_args_is_help=True, help="Run on Flower: a SuperLink, SuperNodes owning partitions, runs.")


DEFAULT_REGISTRY = Path("~/.fedpeft/flower-nodes.json")
_INSECURE = typer.Option("--insecure",
                         help="no TLS: traffic in plain text (trusted networks only; explicit on purpose)")
_ROOT_CERT = typer.Option(help="CA certificate that signed the SuperLink's (from `fedpeft flower certs`): TLS")


def _exec(cmd: list[str]) -> None:
    import os

    from fedpeft.runtime.flower.local import flower_env

    console.print(" ".join(cmd))
    os.execve(cmd[0], cmd, flower_env())


def _need_tls_or_insecure(tls: bool, insecure: bool, what: str) -> None:
    """Exactly one of TLS and --insecure: plain text is never a default."""
    if tls == insecure:
        files = "--ssl-certfile, --ssl-keyfile, --ssl-ca-certfile" if what == "superlink" else "--root-certificates"
        fail(f"{what}: give the TLS files ({files}) or --insecure, not both and not neither")


@app.command("superlink")
def flower_superlink(
    host: Annotated[str, typer.Option(help="address to bind (0.0.0.0 to accept other machines)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="one port for Flower's Fleet, Control and Runtime APIs")] = 9093,
    control_from: Annotated[list[str], typer.Option(
        help="an address or CIDR network (repeatable) whose `flwr run`, `flwr ls` and node registrations the "
             "SuperLink answers, besides its own machine's (loopback, the bound host); every other address reaches "
             "the Fleet API only")] = [],
    anyone_can_submit: Annotated[bool, typer.Option(
        "--i-understand-anyone-can-submit", help="let every address that reaches the port use the Control API: "
                                                 "anyone who can connect can then run code on this machine")] = False,
    ssl_certfile: Annotated[Optional[Path], typer.Option(help="the SuperLink's TLS certificate (server.pem)")] = None,
    ssl_keyfile: Annotated[Optional[Path], typer.Option(help="its private key (server.key)")] = None,
    ssl_ca_certfile: Annotated[Optional[Path], typer.Option(help="the CA certificate that signed it (ca.crt)")] = None,
    enable_supernode_auth: Annotated[bool, typer.Option(
        "--enable-supernode-auth", hidden=True, help="the default under TLS (kept for older commands)")] = False,
    no_node_auth: Annotated[bool, typer.Option(
        "--insecure-no-node-auth", help="under TLS, admit any SuperNode that connects, registered or not (by "
                                        "default only those registered with `fedpeft flower register`)")] = False,
    insecure: Annotated[bool, _INSECURE] = False,
) -> None:
    """Start a Flower SuperLink in the foreground: TLS with the three files, or --insecure. Under TLS only SuperNodes
    registered with `fedpeft flower register` are admitted (--insecure-no-node-auth: any); they connect from
    anywhere that reaches --host:--port. Runs are submitted (the Control API) only from this machine, an SSH tunnel
    to it, or the networks --control-from names."""
    from fedpeft.runtime.flower.local import superlink_cmd
    from fedpeft.runtime.flower.security import Certificates
    from fedpeft.runtime.flower.superlink import networks

    files = (ssl_ca_certfile, ssl_certfile, ssl_keyfile)
    if any(files) and not all(files):
        fail("superlink: TLS needs all of --ssl-certfile, --ssl-keyfile and --ssl-ca-certfile")
    _need_tls_or_insecure(all(files), insecure, "superlink")
    missing = [str(f) for f in files if f is not None and not f.is_file()]
    if missing:
        fail(f"superlink: no such file {', '.join(missing)}")
    tls = all(files)
    if enable_supernode_auth and (no_node_auth or not tls):
        fail("superlink: --enable-supernode-auth needs TLS and excludes --insecure-no-node-auth (under TLS it is "
             "the default)")
    node_auth = tls and not no_node_auth
    if tls and no_node_auth:
        warn("--insecure-no-node-auth: any machine that reaches the port can join as a SuperNode and claim clients")
    if anyone_can_submit and control_from:
        fail("superlink: --control-from and --i-understand-anyone-can-submit exclude each other")
    try:
        networks(control_from)
    except ValueError as e:
        fail(str(e))
    if anyone_can_submit:
        warn("the Control API answers every address that reaches the port: anyone who can connect can submit an "
             "app, and its ServerApp runs on this machine")
    _exec(superlink_cmd(host, port, Certificates(*files) if tls else None, node_auth,
                        None if anyone_can_submit else control_from))


@app.command("supernode")
def flower_supernode(
    superlink: Annotated[str, typer.Option(help="SuperLink address host:port")],
    partitions: Annotated[str, typer.Option(help="fedpeft client ids this node owns, e.g. 0,1")],
    state_dir: Annotated[Path, typer.Option(help="where this node keeps its clients' persistent state")],
    data_dir: Annotated[Optional[Path], typer.Option(help="folder holding the task data (FEDPEFT_DATA_DIR)")] = None,
    port: Annotated[int, typer.Option(help="this node's local ClientApp runtime API port")] = 9094,
    root_certificates: Annotated[Optional[Path], _ROOT_CERT] = None,
    auth_key: Annotated[Optional[Path], typer.Option(help="this node's private key (`fedpeft flower node-key`), "
                                                          "for a SuperLink with --enable-supernode-auth")] = None,
    insecure: Annotated[bool, _INSECURE] = False,
    worker: Annotated[bool, typer.Option(help="keep the model in one long-lived worker process per node (one "
                                              "backbone load per run) rather than loading it for every "
                                              "message")] = True,
    require_secure_aggregation: Annotated[bool, typer.Option(
        "--require-secure-aggregation", help="refuse every training message outside SecAgg+, and SecAgg+ below "
                                             "the node's floor (the policy file's min_* settings)")] = False,
    policy: Annotated[Optional[Path], typer.Option(
        help="YAML file of the node's policy (fedpeft.runtime.node_policy.NodePolicy: require_secure_aggregation, "
             "min_num_shares, min_reconstruction_threshold, threshold_majority, trust_remote_code, models)")] = None,
) -> None:
    """Start a Flower SuperNode owning some fedpeft clients, in the foreground: TLS with --root-certificates, or
    --insecure. The node holds the server to its own policy: no model code unless allowed, state only under
    --state-dir, and with --require-secure-aggregation no update leaves it unmasked."""
    from fedpeft.runtime.flower.local import supernode_cmd
    from fedpeft.runtime.node_policy import load_policy

    _need_tls_or_insecure(root_certificates is not None, insecure, "supernode")
    missing = [str(f) for f in (root_certificates, auth_key) if f is not None and not f.is_file()]
    if missing:
        fail(f"supernode: no such file {', '.join(missing)}")
    try:
        node_policy = load_policy(policy, require_secure_aggregation)
    except (OSError, ValueError) as e:
        fail(f"supernode: {e}")
    ids = [int(x) for x in partitions.split(",") if x.strip()]
    _exec(supernode_cmd(superlink, ids, port, "127.0.0.1", state_dir, data_dir, root_certificates, auth_key,
                        worker, node_policy))


@app.command("certs")
def flower_certs(
    out: Annotated[Path, typer.Option(help="folder for ca.crt, server.pem, server.key")],
    host: Annotated[list[str], typer.Option(help="the SuperLink's address as the nodes reach it (repeatable)")] = [
        "127.0.0.1", "localhost"],
) -> None:
    """Make a CA and a SuperLink TLS certificate signed by it (give ca.crt to every SuperNode)."""
    from fedpeft.runtime.flower.security import make_certificates

    c = make_certificates(out, tuple(host))
    console.print(f"CA {c.ca_cert}\nSuperLink certificate {c.server_cert} (for {', '.join(host)})\nkey {c.server_key}")


@app.command("node-key")
def flower_node_key(
    out: Annotated[Path, typer.Option(help="folder for the key pair")],
    name: Annotated[str, typer.Option(help="file name of the private key (the public one gets .pub)")],
) -> None:
    """Make a SuperNode's authentication key pair (EC P-384, OpenSSH format)."""
    from fedpeft.runtime.flower.security import make_node_key

    k = make_node_key(out, name)
    console.print(f"private {k.private} (keep on the node)\npublic {k.public} (register it)")


@app.command("register")
def flower_register(
    public_key: Annotated[Path, typer.Argument(help="a SuperNode's public key (.pub)")],
    superlink: Annotated[str, typer.Option(help="SuperLink address host:port")] = "127.0.0.1:9093",
    root_certificates: Annotated[Optional[Path], _ROOT_CERT] = None,
    insecure: Annotated[bool, _INSECURE] = False,
    clients: Annotated[Optional[str], typer.Option(
        help="the fedpeft client ids this node serves, e.g. 0,1: bound to its key in --registry, so that no other "
             "node can claim them in a run given that registry")] = None,
    registry: Annotated[Path, typer.Option(
        help="the node registry file (on the SuperLink's machine)")] = DEFAULT_REGISTRY,
) -> None:
    """Register a SuperNode's public key with the SuperLink (admitted under TLS), and with --clients bind the clients
    it serves to it."""
    import tempfile

    from fedpeft.runtime.flower.local import register_node
    from fedpeft.runtime.flower.node_registry import record

    _need_tls_or_insecure(root_certificates is not None, insecure, "register")
    try:
        ids = [int(x) for x in clients.split(",") if x.strip()] if clients is not None else None
    except ValueError:
        fail(f"register: --clients takes client ids like 0,1, not {clients!r}")
    with tempfile.TemporaryDirectory() as home:
        try:
            node = register_node(public_key, superlink, Path(home), root_certificates)
            if ids is not None:
                record(registry, node, public_key, ids)
        except (RuntimeError, ValueError, OSError) as e:
            fail(str(e))
    console.print(f"SuperNode {node} registered" + (f", serving clients {ids} ({registry})" if ids is not None
                                                    else ""))


def _flower_config(config: Path | None, set_: list[str]) -> Any:
    """The experiment of CONFIG and --set for a Flower deployment (runtime.name=flower); its notes shown."""
    from fedpeft.config import ConfigError
    from fedpeft.resolve import load_config

    try:
        cfg = load_config(config, list(set_) + ["runtime.name=flower"])
    except ConfigError as e:
        fail(str(e))
    for note in cfg.notes:
        warn(note)
    return cfg


@app.command("app")
def flower_app(
    out: Annotated[Path, typer.Argument(help="the app directory to write (letters, digits and hyphens)")],
    config: Annotated[Optional[Path], typer.Argument(help="experiment YAML (omit to use the defaults)")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="override a key, e.g. federation.rounds=2")] = [],
    run_dir_: Annotated[Optional[Path], typer.Option(
        "--run-dir", help="the run directory on the SuperLink machine, as the app's default (else flwr run gives "
                          "--run-config \"out='DIR'\")")] = None,
    license_file: Annotated[Optional[Path], typer.Option(
        "--license", help="the app's LICENSE file (default: fedpeft's, Apache-2.0)")] = None,
) -> None:
    """Write a Flower app (FAB format v1) that runs the experiment: `flwr build` bundles it for Flower Hub, `flwr
    run OUT FEDERATION` submits it; every experiment key is in its run config (`--run-config "federation.rounds=5"`)."""
    from fedpeft.runtime.flower.app_bundle import write_app

    cfg = _flower_config(config, set_)
    if license_file is not None and not license_file.is_file():
        fail(f"--license: no such file {license_file}")
    if (out / "pyproject.toml").exists():
        fail(f"{out} already holds an app (pyproject.toml); give another directory")
    try:
        write_app(out, cfg, {"out": str(run_dir_.expanduser().resolve())} if run_dir_ is not None else None,
                  license_file)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    console.print(f"Flower app written to {out}: `flwr build --app {out}` bundles it, `flwr run {out} FEDERATION"
                  "` submits it")


@app.command("run")
def flower_run(
    config: Annotated[Optional[Path], typer.Argument(help="experiment YAML (omit to use the defaults)")] = None,
    superlink: Annotated[str, typer.Option(help="SuperLink address host:port")] = "127.0.0.1:9093",
    set_: Annotated[list[str], typer.Option("--set", help="override a key, e.g. federation.rounds=2")] = [],
    out: Annotated[Optional[Path], typer.Option(help="run directory on the SuperLink machine")] = None,
    resume: Annotated[bool, typer.Option(help="continue from the last checkpoint in --out")] = False,
    round_timeout: Annotated[float, typer.Option(help="seconds to wait for a round's replies (0: "
                                                      "federation.round_timeout, unset there: no limit)")] = 0.0,
    rejoin_wait: Annotated[float, typer.Option(help="seconds a round waits for missing clients' nodes")] = 0.0,
    root_certificates: Annotated[Optional[Path], _ROOT_CERT] = None,
    insecure: Annotated[bool, _INSECURE] = False,
    registry: Annotated[Optional[Path], typer.Option(
        help="a node registry (`fedpeft flower register --clients`): each client is served only by its node")] = None,
) -> None:
    """Submit an experiment to a SuperLink with `flwr run` and wait for it (runtime.name=flower): TLS with
    --root-certificates, or --insecure."""
    from fedpeft.outputs import check_output_dir, os_error_line
    from fedpeft.runtime.flower.deployment import run_flower

    cfg = _flower_config(config, set_)
    out_dir = run_dir(cfg, out)
    try:
        check_output_dir(out_dir, "--out")
        summary = run_flower(cfg, out_dir, resume=resume, superlink=superlink, round_timeout=round_timeout or None,
                             rejoin_wait=rejoin_wait, root_cert=root_certificates, insecure=insecure,
                             registry=registry)
    except (FileExistsError, FileNotFoundError, RuntimeError, ValueError) as e:
        fail(str(e))
    except OSError as e:
        fail(os_error_line(e))
    print_summary(out_dir, summary)
