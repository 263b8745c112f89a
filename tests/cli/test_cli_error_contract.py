"""The CLI's error contract, input by input: exit 2, one line naming the file, field or
argument and the problem, no traceback, nothing written — and every check done before
any simulation starts.

Each case is an input a fresh-clone trial of rlharness turned into a traceback, a stray
file or a run that grew without end. Most run ``main()`` in-process (an
escaping exception fails the test); the pipe and ``/dev/zero`` cases run the real
command in a subprocess.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
import yaml

from harness.exit_codes import ExitCode
from rlharness.cli import main

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT = os.path.join(ROOT, "examples", "scenarios", "default.yaml")
TRACE = os.path.join(ROOT, "examples", "traces", "partial_overlap_2gpu.jsonl")
HEADER = {
    "seq": 0,
    "t": 0,
    "kind": "header",
    "schema": "rlharness.eventlog",
    "version": 1,
    "cluster": {"nodes": 1, "gpus_per_node": 2},
}
SMALL = {
    "name": "small",
    "horizon_s": 600,
    "cluster": {"nodes": 1, "gpus_per_node": 2},
    "pipelines": [{"name": "p1", "type": "nemo_async", "train_gpus": [0], "infer_gpus": [0, 1], "steps": 1}],
}


def _env():
    """The subprocess imports this checkout's rlharness whatever its working directory."""
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def files_under(path):
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs)


def dirs_under(path):
    return sorted(os.path.relpath(os.path.join(d, x), path) for d, xs, _ in os.walk(path) for x in xs)


def run_error(argv, capsys, *must_contain):
    """Run the CLI in-process; it must fail as bad input, in one line, naming the problem."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert not out.strip(), out  # a usage error prints nothing on stdout
    for text in must_contain:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def scenario_file(tmp_path, data=None, text=None, name="s.yaml"):
    path = tmp_path / name
    path.write_text(text if text is not None else yaml.safe_dump(data, sort_keys=False))
    return str(path)


def with_(base, **changes):
    data = json.loads(json.dumps(base))
    data.update(changes)
    return data


def assert_only(tmp_path, *names):
    assert files_under(tmp_path) == sorted(names)


# ----------------------------------------------------------------------------- scenarios


@pytest.mark.parametrize(
    "change,field,limit",
    [
        ({"cluster": {"nodes": 100000000, "gpus_per_node": 2}}, "cluster.nodes", "16,384"),
        ({"cluster": {"nodes": 10000, "gpus_per_node": 8}}, "cluster", "16,384"),
        ({"horizon_s": 1e12}, "horizon_s", "2,592,000"),
    ],
    ids=["nodes", "gpus", "horizon"],
)
def test_scenario_size_limits(tmp_path, capsys, monkeypatch, change, field, limit):
    monkeypatch.chdir(tmp_path)
    path = scenario_file(tmp_path, with_(SMALL, **change))
    run_error(["simulate", path], capsys, "s.yaml", f": {field}: ", limit, "limit")
    assert_only(tmp_path, "s.yaml")


@pytest.mark.parametrize(
    "pipeline_change,field,limit",
    [
        ({"steps": 10**6}, "pipelines[0].steps", "100,000"),
        ({"workload": {"prompts_per_step": 100000000}}, "pipelines[0].workload.prompts_per_step", "65,536"),
        ({"workload": {"decode_tokens_max": 10**9}}, "pipelines[0].workload.decode_tokens_max", "1,000,000"),
        ({"steps": 50000, "workload": {"prompts_per_step": 64}}, "pipelines", "1,000,000"),
    ],
    ids=["steps", "prompts", "decode", "run-total"],
)
def test_pipeline_size_limits(tmp_path, capsys, monkeypatch, pipeline_change, field, limit):
    monkeypatch.chdir(tmp_path)
    data = with_(SMALL)
    data["pipelines"][0].update(pipeline_change)
    path = scenario_file(tmp_path, data)
    run_error(["simulate", path], capsys, f": {field}: ", limit)
    assert_only(tmp_path, "s.yaml")


def test_too_many_pipelines(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = with_(SMALL)
    data["pipelines"] = [dict(SMALL["pipelines"][0], name=f"p{i}") for i in range(300)]
    run_error(["simulate", scenario_file(tmp_path, data)], capsys, ": pipelines: ", "256")


def test_name_nested_20000_deep(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = yaml.safe_dump(with_(SMALL, name="x")).replace("name: x", "name: " + "[" * 20000 + "]" * 20000)
    run_error(["simulate", scenario_file(tmp_path, text=text)], capsys, "s.yaml:", "nested deeper than 32")
    block = "name:\n" + "".join("  " * i + "- \n" for i in range(2000))
    run_error(
        ["simulate", scenario_file(tmp_path, text=block, name="b.yaml")], capsys, "b.yaml:", "nested deeper than 32"
    )
    assert_only(tmp_path, "b.yaml", "s.yaml")


@pytest.mark.parametrize("field", ["steps", "seed"])
def test_5000_digit_number(tmp_path, capsys, monkeypatch, field):
    monkeypatch.chdir(tmp_path)
    data = with_(SMALL)
    text = yaml.safe_dump(data, sort_keys=False)
    text = text.replace("steps: 1", f"steps: {'9' * 5000}") if field == "steps" else text + f"seed: {'7' * 5000}\n"
    run_error(["simulate", scenario_file(tmp_path, text=text)], capsys, "s.yaml:", "5000 digits", "19 digits")
    assert_only(tmp_path, "s.yaml")


def test_20_digit_number_is_outside_64_bits(tmp_path, capsys):
    text = yaml.safe_dump(with_(SMALL, seed=1), sort_keys=False).replace("seed: 1", "seed: 99999999999999999999")
    run_error(["validate", scenario_file(tmp_path, text=text)], capsys, "s.yaml:", "20 digits")


@pytest.mark.parametrize(
    "command,where,limit",
    [("simulate", "/dev/zero: ", "8,388,608 bytes"), ("replay", "/dev/zero:1: ", "16,777,216 bytes")],
)
def test_dev_zero_in_a_subprocess(tmp_path, command, where, limit):
    # a file that never ends: read up to the limit, then one error line (not a memory sink)
    proc = subprocess.run(
        [sys.executable, "-m", "rlharness", command, "/dev/zero"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert where in proc.stderr and limit in proc.stderr
    assert files_under(tmp_path) == [] and dirs_under(tmp_path) == []


@pytest.mark.parametrize("name", ["../../../tmp/x", "a/b", "two\nlines", "..", ".hidden", "x" * 200, ""])
def test_scenario_name_is_a_plain_folder_name(tmp_path, capsys, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    path = scenario_file(tmp_path, with_(SMALL, name=name))
    run_error(["simulate", path], capsys, "s.yaml: name: ")
    assert_only(tmp_path, "s.yaml")
    assert dirs_under(tmp_path) == []


def test_non_utf8_scenario(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_bytes(b"name: small\ndescription: caf\xe9\n")
    run_error(["validate", str(path)], capsys, "s.yaml", "not UTF-8", "line 2")


# ----------------------------------------------------------------------------- output paths


def test_out_holding_a_directory_named_trace_json(tmp_path, capsys):
    out = tmp_path / "run"
    (out / "trace.json").mkdir(parents=True)
    line = run_error(
        ["simulate", scenario_file(tmp_path, SMALL), "--out", str(out), "--quiet"], capsys, "--out", "trace.json"
    )
    assert ".tmp" not in line
    assert files_under(tmp_path) == ["s.yaml"] and dirs_under(out) == ["trace.json"]


def test_out_under_a_regular_file_is_refused_before_simulating(tmp_path, capsys, monkeypatch):
    import simulators.run

    def no_simulation(*a, **k):
        raise AssertionError("the output path must be checked before the simulation starts")

    monkeypatch.setattr(simulators.run, "simulate", no_simulation)
    (tmp_path / "file").write_text("x")
    run_error(
        ["simulate", scenario_file(tmp_path, SMALL), "--out", str(tmp_path / "file" / "run")],
        capsys,
        "--out",
        "not a directory",
    )
    assert_only(tmp_path, "file", "s.yaml")


def test_out_that_is_a_file(tmp_path, capsys):
    (tmp_path / "run").write_text("x")
    run_error(
        ["simulate", scenario_file(tmp_path, SMALL), "--out", str(tmp_path / "run")], capsys, "--out", "not a directory"
    )


def test_simulate_out_would_overwrite_its_input(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    path = scenario_file(tmp_path / "run", SMALL, name="scenario.yaml")
    run_error(["simulate", path, "--out", str(tmp_path / "run")], capsys, "--out", "overwrite the input file")
    assert files_under(tmp_path) == ["run/scenario.yaml"]


def test_replay_out_equal_to_its_input(tmp_path, capsys):
    trace = tmp_path / "in.jsonl"
    trace.write_bytes(open(TRACE, "rb").read())
    before = trace.read_bytes()
    run_error(["replay", str(trace), "--out", str(trace)], capsys, "--out", "is an input of this command")
    run_error(
        ["replay", TRACE, "--expect", str(trace), "--out", str(trace)], capsys, "--out", "is an input of this command"
    )
    assert trace.read_bytes() == before and files_under(tmp_path) == ["in.jsonl"]


def test_replay_out_is_a_directory(tmp_path, capsys):
    run_error(["replay", TRACE, "--out", str(tmp_path)], capsys, "--out", "is a directory")


def test_export_paths_are_checked_before_reading(tmp_path, capsys):
    run_error(["export", TRACE], capsys, "--perfetto", "--png")
    run_error(["export", TRACE, "--png", TRACE], capsys, "--png", "is an input of this command")
    run_error(["export", TRACE, "--perfetto", str(tmp_path)], capsys, "--perfetto", "is a directory")
    assert files_under(tmp_path) == []


# ----------------------------------------------------------------------------- traces


def write_lines(path, lines):
    with open(path, "wb") as fh:
        for line in lines:
            fh.write(
                line if isinstance(line, bytes) else (line if isinstance(line, str) else json.dumps(line)).encode()
            )
            fh.write(b"\n")
    return str(path)


def test_replay_line_nested_100000_deep(tmp_path, capsys):
    deep = '{"seq":1,"t":0,"kind":"admit","pipeline_id":' + "[" * 100000 + "]" * 100000 + "}"
    path = write_lines(tmp_path / "t.jsonl", [HEADER, deep])
    run_error(["replay", path, "--out", str(tmp_path / "o.jsonl")], capsys, "t.jsonl:2:", "nested deeper than 32")
    run_error(["check", path], capsys, "t.jsonl:2:", "nested deeper than 32")
    assert_only(tmp_path, "t.jsonl")


def test_replay_5000_digit_seq(tmp_path, capsys):
    path = write_lines(
        tmp_path / "t.jsonl", [HEADER, '{"seq":' + "9" * 5000 + ',"t":0,"kind":"admit","pipeline_id":"p"}']
    )
    run_error(["replay", path], capsys, "t.jsonl:2:", "5000 digits")
    path = write_lines(
        tmp_path / "u.jsonl", [HEADER, '{"seq":' + "9" * 30 + ',"t":0,"kind":"admit","pipeline_id":"p"}']
    )
    run_error(["replay", path], capsys, "u.jsonl:2:", "'seq'", "64-bit")


def test_header_with_ten_million_nodes(tmp_path, capsys):
    header = dict(HEADER, cluster={"nodes": 10000000, "gpus_per_node": 2})
    path = write_lines(tmp_path / "t.jsonl", [header])
    run_error(["replay", path], capsys, "t.jsonl:1:", "16,384")
    run_error(["export", path, "--png", str(tmp_path / "x.png")], capsys, "t.jsonl:1:", "16,384")
    assert_only(tmp_path, "t.jsonl")


def test_duplicate_json_keys(tmp_path, capsys):
    path = write_lines(
        tmp_path / "t.jsonl", [HEADER, '{"seq":1,"t":0,"kind":"admit","pipeline_id":"a","pipeline_id":"b"}']
    )
    run_error(["replay", path], capsys, "t.jsonl:2:", "duplicate key 'pipeline_id'")


def test_non_utf8_trace_names_its_line(tmp_path, capsys):
    path = write_lines(tmp_path / "t.jsonl", [HEADER, b'{"seq":1,"t":0,"kind":"admit","pipeline_id":"caf\xe9"}'])
    run_error(["replay", path], capsys, "t.jsonl:2:", "not UTF-8")


def test_export_of_a_trace_writes_both_pictures(tmp_path, capsys):
    perfetto, png = tmp_path / "t.json", tmp_path / "t.png"
    assert main(["export", TRACE, "--perfetto", str(perfetto), "--png", str(png)]) == 0
    assert json.loads(perfetto.read_text())["traceEvents"] is not None
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_only(tmp_path, "t.json", "t.png")


# ----------------------------------------------------------------------------- pipes, versions, exit codes


CLOSED_PIPE_ARGV = [
    ["schema"],
    ["replay", TRACE],
    ["simulate", "--quiet", "--no-png"],
    ["--help"],
    ["simulate", "--help"],
    ["--version"],
]
CLOSED_PIPE_IDS = ["schema", "replay", "simulate", "help", "simulate-help", "version"]


class _ClosedPipe(io.TextIOBase):
    """stdout after the reader went away: every write fails as a pipe with no reader does,
    and there is no descriptor to point elsewhere (main's exit-time precaution is a real
    process's matter: below)."""

    def writable(self):
        return True

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self):
        raise io.UnsupportedOperation("fileno")


@pytest.mark.parametrize("argv", CLOSED_PIPE_ARGV, ids=CLOSED_PIPE_IDS)
def test_closed_pipe_is_a_quiet_exit(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    code = main(argv)
    monkeypatch.undo()
    assert capsys.readouterr().err == ""
    assert code == 141, code  # one convention: --help and --version too (argparse alone would exit 0)


@pytest.mark.parametrize("argv", [CLOSED_PIPE_ARGV[2], CLOSED_PIPE_ARGV[5]], ids=["simulate", "version"])
def test_closed_pipe_is_a_quiet_exit_of_a_real_process(argv, tmp_path):
    """The process boundary: exit status 141 and nothing on stderr, Python's own flush of
    stdout at exit included (a command's run and argparse's exit; every command in-process above)."""
    env = _env()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlharness", *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # like `| head` when head is gone before the first write: always EPIPE
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=120)
    assert err == "", err
    assert code == 141, code


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("rlharness ") and out.split()[1][0].isdigit()


def test_help_documents_one_exit_code_convention(capsys):
    for argv in (["--help"], ["simulate", "--help"], ["replay", "--help"], ["check", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        out = capsys.readouterr().out
        for code in ExitCode:
            assert f"\n  {int(code)} " in out, (argv, code)


def test_no_command_and_unknown_option(capsys):
    run_error([], capsys, "a command is required", "validate")
    run_error(["simulate", "--bogus"], capsys, "--bogus")
