"""`radixflow bench multi-candidate` options: --quick defaults, fixed budgets, calibration grid."""
from __future__ import annotations

from pathlib import Path

import pytest

from sglang_radixflow.bench.multi_candidate_cli import options_from_args, parse_grid
from sglang_radixflow.bench.options import QUICK_BUDGETS
from sglang_radixflow.bench.runner import budget_args
from sglang_radixflow.cli import build_parser


def _opts(argv: str):
    return options_from_args(build_parser().parse_args(["bench", "multi-candidate", *argv.split()]))


def test_each_bench_routes_by_default_what_suits_its_traffic() -> None:
    from sglang_radixflow.bench import agent_cli

    assert _opts("--out x --workers 2").fleet.router == "cache_aware"  # documents: prefix-aware routing
    agent_args = build_parser().parse_args(["bench", "agent", "--out", "x", "--quick", "--workers", "2"])
    # agents: pinned by trajectory, new trajectories dealt to the workers in turn
    assert agent_cli.options_from_args(agent_args).fleet.router == "sticky_round_robin"
    assert _opts("--out x").fleet.router == "none"
    assert _opts("--out x --workers 2 --router manual").fleet.router == "manual"


def test_quick_fixes_budgets_and_size() -> None:
    o = _opts("--out x --quick")
    assert o.quick and o.budgets == QUICK_BUDGETS and o.workload.questions == 16
    assert o.arms == ("sglang", "prefix-stop", "radixflow") and o.models == ("nemotron_h", "qwen3")


def test_explicit_options() -> None:
    o = _opts("--out x --arms sglang,radixflow --models qwen3 --questions 5 --rate 9 --stream cold --seed 3 "
              "--budgets 4,512 --order reverse --doc-scale 0.5")
    assert o.arms == ("sglang", "radixflow") and o.models == ("qwen3",) and o.budgets == (4, 512)
    w = o.workload
    assert (w.questions, w.rate, w.stream, w.seed, w.order, w.doc_scale) == (5, 9.0, "cold", 3, "reverse", 0.5)
    assert _opts("--out x").workload.doc_scale == 1.0
    assert _opts("--out x").budgets is None  # calibrate
    assert _opts("--out x --calibration-grid 4x256,8x512").calibration_grid == ((4, 256), (8, 512))


def test_bad_options() -> None:
    with pytest.raises(ValueError):
        _opts("--out x --arms sglang,fastest")
    with pytest.raises(ValueError):
        parse_grid("16-2048")


def test_budget_flags() -> None:
    args = budget_args(16, 2048, 32768)
    pairs = dict(zip(args[::2], args[1::2]))
    # S caps every prefill round; the running set also holds the round still in flight under the overlap scheduler.
    assert pairs == {"--prefill-max-requests": "16", "--max-running-requests": "32", "--chunked-prefill-size": "2048",
                     "--max-prefill-tokens": "2048", "--max-total-tokens": "32768"}


@pytest.mark.parametrize("argv, message", [
    ("multi-candidate --models foo", "unknown model(s) foo; allowed: nemotron_h, qwen3, qwen3_next"),
    ("multi-candidate --budgets 8", "--budgets '8': expected S,T"),
    ("multi-candidate --budgets 0,2048", "budgets S,T = (0, 2048): both must be positive"),
    ("multi-candidate --calibration-grid 8x", "calibration grid item '8x': expected SxT"),
    ("multi-candidate --kv-tokens 0", "--kv-tokens 0: must be >= 1"),
    ("multi-candidate --doc-scale 2", "doc_scale=2.0: must be in (0, 1] (1 = the default document lengths)"),
    ("multi-candidate --arms sglang,fastest", "unknown arm(s) fastest; allowed: sglang,"),
    ("multi-candidate --server-args=--chunked-prefill-size=512",
     "--chunked-prefill-size set by the bench itself (its own options); any other SGLang server flag is allowed"),
    ("multi-candidate --server-args=--schedule-policy='lpm", "--server-args \"--schedule-policy='lpm\": No closing"),
    # a single flag written as the help shows it, with a space after --server-args, reaches the bench's check
    ("multi-candidate --server-args --chunked-prefill-size=64", "--chunked-prefill-size set by the bench itself"),
    ("agent --models qwen4", "unknown model(s) qwen4; allowed:"),
    ("agent --rr-block 0", "--rr-block 0: must be >= 1"),
    ("agent --agents 4 --active 4", "need 0 < active (n_a=4) < capacity"),
    ("agent --first-tokens 100000", "over the tiny models' 16384 positions"),
    ("multi-candidate --sweep-rates 1,2", "--sweep-rates: fix the budgets (--budgets S,T or --quick)"),
    ("multi-candidate --quick --arms radixflow --sweep-rates 1,2", "--slo-p95 auto is 2x the sglang arm's P95"),
    ("multi-candidate --quick --sweep-rates 1,x", "--sweep-rates '1,x': expected a comma list"),
    ("multi-candidate --quick --anchor --path select", "--anchor with --path select: the anchor request exists on"),
    ("agent --model-path /no/such/model", "--model-path /no/such/model: no such directory"),
    ("agent --models qwen3 --model-path .", "--models (tiny archs) and --model-path (your model directory): give one"),
    ("agent --server-args=--radix-eviction-policy=lru", "--radix-eviction-policy set by the bench itself"),
    ("multi-candidate --model-path /no/such/model", "--model-path /no/such/model: no such directory"),
    ("multi-candidate --arms sglang,prefix-stop,radixflow --url http://127.0.0.1:1",
     "--url gives 1 server(s) for 3 arm(s) (sglang, prefix-stop, radixflow): one URL per arm, in --arms order"),
    ("multi-candidate --url http://127.0.0.1:1", "http://127.0.0.1:1/server_info:"),  # nothing answers there
    ("multi-candidate --arms radixflow --url http://127.0.0.1:1 --budgets 8,64",
     "--budgets with --url: the servers' own budgets are used"),
    ("multi-candidate --arms radixflow --url http://127.0.0.1:1 --path select",
     "--path select with --url needs the served model's tokenizer: add --model-path DIR"),
    ("multi-candidate --router manual", "--router manual with one worker: give --workers N"),
    ("multi-candidate --workers 0", "--workers 0: must be >= 1"),
    ("multi-candidate --workers 2 --path fork", "--workers with --path fork: runs through a gateway use the raw path"),
    ("multi-candidate --workers 2 --url http://127.0.0.1:1", "--workers with --url: the bench starts the workers"),
    ("multi-candidate --workers 2 --quick --sweep-rates 1,2", "--sweep-rates with --workers: goodput is measured"),
    ("agent --quick --workers 2 --api chat", "--workers with --api chat: runs through a gateway use --api generate"),
    ("agent --quick --router round_robin", "--router round_robin with one worker"),
    ("multi-candidate --router-args --cache-threshold=0.5", "--router-args with one worker"),
])
def test_bad_bench_options_stop_with_one_line_before_any_work(argv: str, message: str, tmp_path) -> None:
    """What a user sees: `radixflow bench ...: <what was wrong and what is allowed>`, no traceback, nothing written
    and no server started."""
    import signal

    from sglang_radixflow.cli import main

    out = tmp_path / "run"
    command, *rest = argv.split()
    handler = signal.getsignal(signal.SIGTERM)  # main() installs its own (stop_servers_on_sigterm): put pytest's back
    try:
        with pytest.raises(SystemExit) as exc:
            main(["bench", command, "--out", str(out), *rest])
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert str(exc.value).startswith(f"radixflow bench {command}: ")
    assert message in str(exc.value)
    assert not out.exists()


def test_hybrid_strategy_reaches_both_benches_and_is_checked_per_model() -> None:
    from sglang_radixflow.bench import agent_cli
    from sglang_radixflow.bench.server import check_hybrid_strategy

    assert _opts("--out x --models nemotron_h,qwen3 --hybrid-strategy extra_buffer").mamba_strategy == "extra_buffer"
    args = build_parser().parse_args(["bench", "agent", "--out", "x", "--quick", "--hybrid-strategy", "extra_buffer"])
    assert agent_cli.options_from_args(args).mamba_strategy == "extra_buffer"
    assert _opts("--out x").mamba_strategy == "no_buffer"
    check_hybrid_strategy("extra_buffer")
    with pytest.raises(ValueError, match="allowed: no_buffer, extra_buffer"):
        check_hybrid_strategy("lazy")


def test_agent_arm_server_runs_the_hybrid_strategy_asked_for(tmp_path) -> None:
    """The agent bench's option reaches the server it starts (its command line), on the hybrid only."""
    import json

    from sglang_radixflow.bench import agent, agent_cli
    from sglang_radixflow.bench.agent_workload import AgentParams
    from sglang_radixflow.models import MARKER_FILE

    models = {}
    for arch in ("nemotron_h", "qwen3"):
        models[arch] = tmp_path / arch
        models[arch].mkdir()
        (models[arch] / MARKER_FILE).write_text(json.dumps({"arch": arch}))
    params = AgentParams(**agent_cli.QUICK)
    # overlap as SGLang has it: only the hybrid strategy's own flags are checked here (auto: see test_agent_bench)
    opts = agent.AgentBenchOptions(out=tmp_path, params=params, mamba_strategy="extra_buffer", overlap_schedule="on")

    def command(arch: str) -> list[str]:
        server = agent.arm_server(models[arch], arch, "rr", params, opts, {}, tmp_path / "log")
        server.cpu = True
        return server.command()

    hybrid = command("nemotron_h")
    assert hybrid[hybrid.index("--mamba-radix-cache-strategy") + 1] == "extra_buffer"
    assert "--disable-overlap-schedule" not in hybrid  # extra_buffer keeps SGLang's overlap scheduler
    assert hybrid[hybrid.index("--radix-eviction-policy") + 1] == "rr"
    assert "--mamba-radix-cache-strategy" not in command("qwen3")


def test_overlap_schedule_option_reaches_every_arms_server(tmp_path, monkeypatch) -> None:
    """`auto` (the default) runs every arm's server without SGLang's overlap loop on a CPU and keeps SGLang's default
    on a GPU; `on` / `off` are taken as given. The setting is what the server's command line carries."""
    import json

    from sglang_radixflow.bench import options, runner, server
    from sglang_radixflow.models import MARKER_FILE

    model = tmp_path / "qwen3"
    model.mkdir()
    (model / MARKER_FILE).write_text(json.dumps({"arch": "qwen3"}))

    def flags(argv: str, cpu: bool) -> dict[str, bool]:
        monkeypatch.setattr(server, "on_cpu", lambda: cpu)
        opts = _opts(f"--out {tmp_path} --models qwen3 {argv}")
        return {arm: "--disable-overlap-schedule" in runner.make_server(
            model, arm, 8, 2048, opts, tmp_path / "log", None).command() for arm in ("sglang", "radixflow")}

    assert flags("", cpu=True) == {"sglang": True, "radixflow": True}
    assert flags("", cpu=False) == {"sglang": False, "radixflow": False}
    assert flags("--overlap-schedule on", cpu=True) == {"sglang": False, "radixflow": False}
    assert flags("--overlap-schedule off", cpu=False) == {"sglang": True, "radixflow": True}
    with pytest.raises(ValueError, match="allowed: auto, on, off"):
        options.BenchOptions(out=tmp_path, workload=_opts("--out x").workload, overlap_schedule="sometimes")


def test_server_args_reach_every_arms_server_and_the_report(tmp_path) -> None:
    """--server-args (e.g. SGLang's --schedule-policy) goes to every arm's server, after the bench's own flags, and
    the workload record and report say so."""
    import json

    from sglang_radixflow.bench import runner
    from sglang_radixflow.bench.report_md import format_report
    from sglang_radixflow.models import MARKER_FILE

    model = tmp_path / "qwen3"
    model.mkdir()
    (model / MARKER_FILE).write_text(json.dumps({"arch": "qwen3"}))
    opts = _opts(f"--out {tmp_path} --models qwen3 --server-args=--schedule-policy=lpm")
    assert opts.extra_server_args == ("--schedule-policy=lpm",)
    for arm in ("sglang", "radixflow"):
        assert "--schedule-policy=lpm" in runner.make_server(model, arm, 8, 2048, opts, tmp_path / "log", None).command()
    assert _opts("--out x").extra_server_args == ()
    summary = {"workload": {"server_args": ["--schedule-policy", "lpm"]}, "budgets": {"S": 8, "T": 2048,
               "calibrated_on": "fixed"}, "arms": {}, "cost_identity": {}}
    assert "extra server flags `--schedule-policy lpm`" in format_report(summary)


def test_server_args_take_a_single_flag_after_a_space() -> None:
    """`--server-args --enable-mixed-chunk`: argparse alone reads the value as an unknown option and stops with
    "expected one argument"; the CLI attaches it to its option first."""
    from sglang_radixflow.bench.server import attach_option_values

    argv = ["bench", "multi-candidate", "--out", "x", "--server-args", "--enable-mixed-chunk", "--quick"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert attach_option_values(argv)[4:] == ["--server-args=--enable-mixed-chunk", "--quick"]
    assert options_from_args(build_parser().parse_args(attach_option_values(argv))).extra_server_args == (
        "--enable-mixed-chunk",)
    # a value with a space (which argparse already read) parses as before; other arguments are left alone
    spaced = ["bench", "multi-candidate", "--out", "x", "--server-args", "--schedule-policy lpm"]
    assert build_parser().parse_args(attach_option_values(spaced)).server_args == "--schedule-policy lpm"
    assert attach_option_values(["--out", "--x", "--server-args", "lpm"]) == ["--out", "--x", "--server-args", "lpm"]


def test_free_ports_are_below_the_ephemeral_range_bindable_and_never_handed_out_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from sglang_radixflow.bench import server

    low, high = server.PORT_RANGE
    assert high < 22000  # below SGLang's torch.distributed pick (22000-29999) and the kernel's ephemeral range
    ports = [server.free_port() for _ in range(50)]
    assert all(low <= p <= high for p in ports) and len(set(ports)) == 50

    def bindable(port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
                return True
            except OSError:
                return False

    # Two neighbouring ports, the second free: in our range, not the kernel's ephemeral one, where a neighbour of
    # a port bound to 0 may be any client's (or in TIME_WAIT) while other processes talk HTTP.
    busy = next(p for p in range(high - 1, low, -2) if bindable(p) and bindable(p + 1))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:  # a port someone holds is skipped
        held.bind(("127.0.0.1", busy))
        held.listen()
        monkeypatch.setattr(server, "PORT_RANGE", (busy, busy + 1))
        monkeypatch.setattr(server, "_handed_out", set())
        monkeypatch.setattr(server, "PORT_ATTEMPTS", 2)
        assert server.free_port() == busy + 1
        with pytest.raises(server.ServerError, match="no free port"):
            server.free_port()  # busy + 1 was handed out, busy is held


def test_a_relative_trace_path_reaches_the_server_absolute(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Servers run in another directory (SERVER_CWD): a trace path relative to ours, given by a bench (the soak's
    `--out runs/x`) or set by the user, must be made absolute, or the trace goes to the server's folder unseen."""
    from sglang_radixflow.bench.server import SERVER_CWD, SGLangServer

    monkeypatch.chdir(tmp_path)
    here = Path.cwd()
    assert here != Path(SERVER_CWD).resolve()
    srv = SGLangServer(str(tmp_path), env={"RADIXFLOW_TRACE": "runs/soak/radixflow.rank{tp_rank}.trace.jsonl"})
    assert srv.process_env()["RADIXFLOW_TRACE"] == str(here / "runs/soak/radixflow.rank{tp_rank}.trace.jsonl")
    monkeypatch.setenv("RADIXFLOW_TRACE", "mine.jsonl")  # the user's own, inherited
    assert SGLangServer(str(tmp_path)).process_env()["RADIXFLOW_TRACE"] == str(here / "mine.jsonl")
    absolute = str(tmp_path / "abs.jsonl")
    assert SGLangServer(str(tmp_path), env={"RADIXFLOW_TRACE": absolute}).process_env()["RADIXFLOW_TRACE"] == absolute


def test_version_and_top_level_help_name_the_serving_command(capsys) -> None:
    from sglang_radixflow import __version__

    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--version"])
    assert capsys.readouterr().out.strip() == f"sglang-radixflow {__version__} (for SGLang 0.5.23)"
    assert "python -m sglang.launch_server --model-path DIR --radix-cache radixflow" in parser.format_help()


def test_a_model_directory_of_ones_own_is_read_from_its_config(tmp_path) -> None:
    """--model-path takes any HF model directory: hybrid or not by its config (the CPU flags), vocabulary checked."""
    import json

    from sglang_radixflow.bench.options import check_model_dir
    from sglang_radixflow.models import is_hybrid_model

    def model(name: str, config: dict) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config))
        return path

    qwen35 = model("Qwen3.5-27B", {"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text",
                                                                           "vocab_size": 248320}})
    llama = model("llama", {"model_type": "llama", "vocab_size": 128256})
    small = model("small", {"model_type": "llama", "vocab_size": 1000})
    assert is_hybrid_model(qwen35) and not is_hybrid_model(llama)
    assert is_hybrid_model(model("nemo", {"model_type": "nemotron_h", "vocab_size": 131072}))
    check_model_dir(qwen35)
    with pytest.raises(ValueError, match="its vocabulary has 1000 ids; the workload draws ids below 2048"):
        check_model_dir(small)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        is_hybrid_model(tmp_path)
    opts = _opts(f"--out x --model-path {qwen35} --quick")
    assert opts.models == ("Qwen3.5-27B",) and opts.model_path == qwen35


def test_your_own_model_on_a_gpu_keeps_sglangs_pool_sizing(tmp_path, monkeypatch) -> None:
    """The tiny models' 32768-token pool is a CPU setting: with --model-path on a GPU the servers get no
    --max-total-tokens unless --kv-tokens asks for one."""
    import json

    from sglang_radixflow.bench import multi_candidate_cli

    model = tmp_path / "Big"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 128256}))
    monkeypatch.setattr(multi_candidate_cli, "on_cpu", lambda: False)
    assert _opts(f"--out x --model-path {model} --quick").kv_tokens is None
    assert "--max-total-tokens" not in budget_args(16, 8192, None)
    assert _opts(f"--out x --model-path {model} --quick --kv-tokens 65536").kv_tokens == 65536
    assert _opts("--out x --quick").kv_tokens == 32768  # the tiny models: always the fixed pool
    monkeypatch.setattr(multi_candidate_cli, "on_cpu", lambda: True)
    assert _opts(f"--out x --model-path {model} --quick").kv_tokens == 32768
