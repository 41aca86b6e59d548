"""Gather the GPU check's figures into what comes back: gpu_check.json, summary.md, report.png, logs_tail.txt.

``python scripts/gpu_summary.py --work WORK --output OUT --mode gpu|dry-run-cpu --elapsed S --budget S``
reads WORK/steps.tsv (one line per step: name, status, seconds, limit, log, note), the JSON documents of
WORK/json/ (benchmark, callback-bench, pipeline-bench, imports, pytest's JUnit XML), the run.json of every
fit under WORK/runs/ (its figures and its diagnosis: what limits it, the bound, what it could not judge)
and the report's samples/s figure, and writes at most four files directly under OUT
(no folders, no checkpoints). The summary (at most 6,000 characters, cut with a note if longer) is
printed last. Every figure keeps the evidence label of the document it comes from.

``python scripts/gpu_summary.py --best-batch BENCH.json --precision P`` prints the batch size of the
fastest ``ok`` row of precision P (samples/s), for the compiled and CUDA-graph steps.

Standard library only (it must run even where a step's imports failed).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

SUMMARY_LIMIT = 6000
LOG_TAIL_LINES = 40
LOG_TAIL_BYTES = 400_000
OUT_FILES = ("gpu_check.json", "summary.md", "report.png", "logs_tail.txt")


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def best_batch(doc: dict[str, Any], precision: str) -> int | None:
    """Batch size of the ``ok`` row of ``precision`` with the most samples/s, or None."""
    rows = [r for r in doc.get("results", []) if r.get("precision") == precision and r.get("status") == "ok"
            and r.get("samples_per_s")]
    return max(rows, key=lambda r: r["samples_per_s"])["batch_size"] if rows else None


def read_steps(work: Path) -> list[dict[str, Any]]:
    """The rows of WORK/steps.tsv as dicts."""
    steps = []
    path = work / "steps.tsv"
    for line in path.read_text().splitlines() if path.exists() else []:
        name, status, seconds, limit, log, note = (line.split("\t") + [""] * 6)[:6]
        steps.append({"name": name, "status": status, "seconds": int(seconds or 0), "limit_s": int(limit or 0),
                      "log": log or None, "note": note or None})
    return steps


_BENCH_KEYS = ("precision", "precision_label", "batch_size", "status", "error", "compile", "compile_mode",
               "samples_per_s", "median_step_ms", "p95_step_ms", "achieved_tflops", "peak_tflops", "mfu",
               "mfu_reason", "peak_memory_gib", "peak_memory_kind", "energy_j", "energy_j_per_sample",
               "energy_method", "energy_reason", "avg_power_w", "nonfinite_steps", "evidence")


def bench_rows(work: Path) -> dict[str, Any]:
    """Every benchmark row (its figures, without the raw step times) by document name."""
    out = {}
    for path in sorted((work / "json").glob("bench-*.json")):
        doc = _load(path)
        if not isinstance(doc, dict):
            continue
        out[path.stem] = {"evidence": doc.get("evidence"), "device": (doc.get("environment") or {}).get("device"),
                          "rows": [{k: r.get(k) for k in _BENCH_KEYS} for r in doc.get("results", [])]}
    return out


def _last(items: list | None) -> dict[str, Any]:
    return items[-1] if items else {}


def _medians(windows: dict[str, Any] | None) -> dict[str, Any]:
    return {k: (v or {}).get("median") for k, v in (windows or {}).items()}


def _diagnosis(diag: dict[str, Any] | None) -> dict[str, Any] | None:
    """The run's diagnosis (run.json["diagnosis"]): its limit, every finding's line and what it could not judge."""
    if not diag:
        return None
    return {"limit": diag.get("limit"), "lines": [f.get("line") for f in diag.get("findings") or []],
            "not_judged": diag.get("not_judged") or [], "error": diag.get("error")}


def fit_figures(work: Path) -> dict[str, Any]:
    """Per fit (run folder name): status, steps, last-epoch device/host windows, samples/s, MFU, energy, memory."""
    fits = {}
    for run_json in sorted(work.glob("runs/*/version_*/run.json")):
        rec = _load(run_json) or {}
        s = rec.get("summary") or {}
        st, th, en, mem, ls = (s.get(k) or {} for k in ("step_timing", "throughput", "energy", "memory",
                                                       "loss_scale"))
        last_st, last_th = _last(st.get("epochs")), _last(th.get("epochs"))
        fits[run_json.parent.parent.name] = {
            "evidence": rec.get("evidence"), "status": rec.get("status"), "device": th.get("device"),
            "dtype": th.get("dtype"), "clock": st.get("clock"), "steps_total": st.get("steps_total"),
            "steps_measured": st.get("steps_measured"),
            "windows_ms_median": _medians(last_st.get("windows_ms")),
            "host_windows_ms_median": _medians(last_st.get("host_windows_ms")),
            "samples_per_s": last_th.get("samples_per_s"), "mfu": last_th.get("mfu"),
            "mfu_reason": th.get("mfu_reason"), "tflops_per_s_per_gpu": last_th.get("tflops_per_s_per_gpu"),
            "energy_available": en.get("available"), "energy_method": en.get("method"),
            "energy_reason": en.get("reason"), "energy_j": en.get("total_energy_j"),
            "j_per_sample": en.get("j_per_sample"), "peak_allocated_gib": mem.get("peak_allocated_gib"),
            "host_peak_rss_gib": mem.get("host_peak_rss_gib"), "scaler_in_use": ls.get("scaler_in_use"),
            "skipped_steps": ls.get("skipped_steps"), "metrics": rec.get("metrics"),
            "diagnosis": _diagnosis(rec.get("diagnosis")),
        }
    return fits


def test_figures(work: Path, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts and failed names from pytest's JUnit XML; in dry mode the collect-only line of the log."""
    xml = work / "json" / "gpu-tests.xml"
    if xml.exists():
        try:
            root = ET.parse(xml).getroot()
        except ET.ParseError as err:
            return {"error": f"unreadable JUnit XML: {err}"}
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        failed = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
                  if c.find("failure") is not None or c.find("error") is not None]
        return {"tests": int(suite.get("tests", 0)), "failures": int(suite.get("failures", 0)),
                "errors": int(suite.get("errors", 0)), "skipped": int(suite.get("skipped", 0)), "failed": failed}
    step = next((s for s in steps if s["name"] == "gpu-tests"), None)
    if step and step["log"] and Path(step["log"]).exists():
        tail = [ln for ln in Path(step["log"]).read_text(errors="replace").splitlines() if ln.strip()][-3:]
        return {"collect_only": True, "last_lines": tail}
    return {}


def gather(work: Path, mode: str, elapsed: int, budget: int, carry: str | None) -> dict[str, Any]:
    """The whole document of gpu_check.json."""
    steps = read_steps(work)
    js = work / "json"
    smi = next((s for s in steps if s["name"] == "nvidia-smi"), None)
    smi_log = Path(smi["log"]) if smi and smi["log"] else None
    smi_text = smi_log.read_text(errors="replace") if smi_log and smi_log.exists() else None
    manifest = Path(carry, "MANIFEST.txt") if carry else None
    return {
        "schema": "cropscale.gpu_check/1", "mode": mode, "elapsed_s": elapsed, "budget_s": budget,
        "steps": steps, "imports": _load(js / "imports.json"), "nvidia_smi": smi_text,
        "benchmarks": bench_rows(work), "fits": fit_figures(work), "callback_bench": _load(js / "callback-bench.json"),
        "pipeline": _load(js / "pipeline.json"), "gpu_tests": test_figures(work, steps),
        "carry_manifest": manifest.read_text() if manifest and manifest.exists() else None,
    }


def _f(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _bench_lines(benches: dict[str, Any]) -> list[str]:
    lines = ["| run | label | batch | status | samples/s | step ms | MFU | peak GiB | J/sample |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, doc in benches.items():
        for r in doc["rows"]:
            label = r["precision_label"] + (f" compiled {r['compile_mode']}" if r.get("compile") else "")
            lines.append(f"| {name.removeprefix('bench-')} | {label} | {r['batch_size']} | {r['status']} | "
                         f"{_f(r['samples_per_s'], '.1f')} | {_f(r['median_step_ms'], '.2f')} | "
                         f"{_f(r['mfu'], '.3f')} | "
                         f"{_f(r['peak_memory_gib'], '.3f')} | {_f(r['energy_j_per_sample'], '.4f')} |")
    reasons = {r.get("mfu_reason") for d in benches.values() for r in d["rows"] if r.get("mfu_reason")}
    reasons |= {r.get("energy_reason") for d in benches.values() for r in d["rows"] if r.get("energy_reason")}
    lines += [f"- {why}" for why in sorted(reasons)[:4]]
    return lines


def _fit_lines(fits: dict[str, Any]) -> list[str]:
    lines = []
    for name, f in fits.items():
        w, h = f["windows_ms_median"], f["host_windows_ms_median"]
        lines.append(f"- {name}: {f['status']}, {f['dtype']} on {f['device']}, {f['steps_total']} steps; "
                     f"step {_f(w.get('step'), '.2f')} ms, forward {_f(w.get('forward'), '.2f')}, backward "
                     f"{_f(w.get('backward'), '.2f')}, optimizer {_f(w.get('optimizer'), '.2f')} "
                     f"(clock {f['clock']}); host data wait {_f(h.get('data_wait_host'), '.2f')} ms, host transfer "
                     f"{_f(h.get('transfer_host'), '.2f')} ms; {_f(f['samples_per_s'], '.1f')} samples/s, MFU "
                     f"{_f(f['mfu'], '.3f')}; energy {_f(f['energy_j'], '.1f')} J "
                     f"({f['energy_method'] or f['energy_reason']}), {_f(f['j_per_sample'], '.3f')} J/sample; "
                     f"peak {_f(f['peak_allocated_gib'], '.3f')} GiB allocated;"
                     f" loss scaler {f['scaler_in_use']}, skipped {f['skipped_steps']} [{f['evidence']}]")
        diag = f.get("diagnosis")
        if diag is None:
            lines.append("  - limit: n/a (no diagnosis in run.json)")
            continue
        found = diag["lines"] or [f"n/a ({diag['error'] or 'nothing recorded'})"]
        lines.append(f"  - limit: {found[0]} [measured-run; bounds analytical-scenario]")
        lines += [f"  - also: {line}" for line in found[1:3]]
    gaps = next((n for f in fits.values() for n in (f.get("diagnosis") or {}).get("not_judged", [])
                 if n.startswith("host gaps")), None)
    if gaps:
        lines.append(f"- {gaps}")
    return lines


def summary_text(doc: dict[str, Any]) -> str:
    """The Markdown summary (at most :data:`SUMMARY_LIMIT` characters)."""
    failed = [s for s in doc["steps"] if s["status"] not in ("ok", "not-rehearsed")]
    lines = [f"# cropscale GPU check ({doc['mode']}): {doc['elapsed_s']} s of a {doc['budget_s']} s budget", ""]
    imp = doc.get("imports") or {}
    if imp:
        lines.append(f"Python {imp.get('python')}, torch {imp.get('cuda', {}).get('torch')}, CUDA "
                     f"{imp.get('cuda', {}).get('cuda')}, device {imp.get('cuda', {}).get('device') or 'none (CPU)'}")
        lines += [f"- MISSING {k}: {v[:160]}" for k, v in list((imp.get("missing") or {}).items())[:12]]
    if doc.get("nvidia_smi"):
        csv = [ln for ln in doc["nvidia_smi"].splitlines() if ln.count(",") >= 3][-1:]
        lines += [f"nvidia-smi: {ln}" for ln in csv]
    lines += ["", "## Steps"]
    lines += [f"- {s['status']:<13} {s['name']} ({s['seconds']} s of {s['limit_s']} s)"
              + (f": {s['note']}" if s["note"] else "") for s in doc["steps"]]
    if doc["benchmarks"]:
        lines += ["", "## Compute-only benchmark [measured-microbenchmark]"] + _bench_lines(doc["benchmarks"])
    if doc["fits"]:
        lines += ["", "## Fits of the bundled sample (device-timeline windows; host data wait and transfer)"]
        lines += _fit_lines(doc["fits"])
    cb = doc.get("callback_bench") or {}
    if cb:
        lines += ["", f"## Callback overhead: {_f((cb.get('overhead_us') or {}).get('on'), '+.1f')} µs/step "
                  f"({_f(100 * (cb.get('overhead_ratio') or {}).get('on', 0), '+.1f')} %) on a "
                  f"{_f((cb.get('median_off_step_us_of') or {}).get('on'), '.1f')} µs step, device "
                  f"{(cb.get('setup') or {}).get('device', 'cpu')} [{cb.get('evidence')}]"]
    pipe = doc.get("pipeline") or {}
    if pipe:
        lines += ["", f"## Pipeline ratio (end-to-end / compute-only): {_f(pipe.get('ratio'), '.3f')} "
                  f"[{pipe.get('evidence')}]"]
    tests = doc.get("gpu_tests") or {}
    if tests:
        lines += ["", "## gpu tests"]
        if "tests" in tests:
            lines.append(f"{tests['tests']} run, {tests['failures']} failed, {tests['errors']} errors, "
                         f"{tests['skipped']} skipped")
            lines += [f"- FAILED {n}" for n in tests["failed"][:10]]
        else:
            lines += [f"    {ln}" for ln in tests.get("last_lines", [])] + [tests.get("error", "")]
    lines += ["", f"files: {', '.join(OUT_FILES)}",
              "gpu_check: every step finished" if not failed else
              f"gpu_check: {len(failed)} step(s) FAILED, ran out of time or were skipped: "
              + ", ".join(s["name"] for s in failed)]
    text = "\n".join(lines) + "\n"
    if len(text) > SUMMARY_LIMIT:
        note = f"\n[summary cut at {SUMMARY_LIMIT} characters: gpu_check.json has every figure]\n"
        keep = SUMMARY_LIMIT - len(note) - len(lines[-1]) - 2
        text = text[:keep] + note + lines[-1] + "\n"
    return text


def logs_tail(steps: list[dict[str, Any]]) -> str:
    """The last lines of every step's log, capped at :data:`LOG_TAIL_BYTES`."""
    parts = []
    for s in steps:
        if s["log"] and Path(s["log"]).exists():
            tail = Path(s["log"]).read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            parts.append(f"==== {s['name']} ({s['status']}, {s['seconds']} s)\n" + "\n".join(tail))
    text = "\n".join(parts) + "\n"
    return text[-LOG_TAIL_BYTES:]


def main() -> int:
    """Entry point; returns 0, or 1 when a step failed."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--best-batch", default=None, help="benchmark JSON: print the fastest batch of --precision")
    p.add_argument("--precision", default="bf16-mixed")
    p.add_argument("--work", type=Path)
    p.add_argument("--output", type=Path)
    p.add_argument("--mode", default="gpu")
    p.add_argument("--elapsed", type=int, default=0)
    p.add_argument("--budget", type=int, default=0)
    p.add_argument("--carry", default=None)
    args = p.parse_args()
    if args.best_batch:
        best = best_batch(_load(Path(args.best_batch)) or {}, args.precision)
        if best is None:
            return 1
        print(best)
        return 0
    doc = gather(args.work, args.mode, args.elapsed, args.budget, args.carry)
    args.output.mkdir(parents=True, exist_ok=True)
    for name in OUT_FILES:  # what an earlier run left here must not come back as this run's
        (args.output / name).unlink(missing_ok=True)
    (args.output / "gpu_check.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    png = args.work / "report" / "throughput.png"
    if png.exists():
        shutil.copyfile(png, args.output / "report.png")
    (args.output / "logs_tail.txt").write_text(logs_tail(doc["steps"]))
    text = summary_text(doc)
    (args.output / "summary.md").write_text(text)
    sys.stdout.write(text)
    return 0 if all(s["status"] in ("ok", "not-rehearsed") for s in doc["steps"]) else 1


if __name__ == "__main__":
    sys.exit(main())
