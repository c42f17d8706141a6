"""The harness's printed tables: one renderer per section of results.json, the targets' status last."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        "",
        f"anemoi-profiler benchmarks ({meta['mode']}) on {meta['device']} ({meta['device_name']}), "
        f"{meta['cpu_count']} CPUs, load average {fmt_load(meta['load_average_start'])} at start, "
        f"{fmt_load(meta['load_average_end'])} at end",
        f"model: {meta['model']}",
    ]
    lines += render_overhead(results.get("overhead"))
    lines += render_throughput(results.get("throughput_accuracy"))
    lines += render_sink(results.get("sink_cost"))
    lines += render_cost(results.get("always_on_cost"))
    lines += render_trace(results.get("trace_cost"), results.get("report_cost"))
    lines += render_hta(results.get("hta_scaling"))
    lines += render_detailed(results.get("detailed_preset"))
    lines += render_short_run(results.get("short_run"))
    lines += render_window_end(results.get("window_end"))
    lines += ["", "Targets"]
    for target in results["targets"]:
        value = "n/a" if target["value"] is None else f"{target['value']:.3g}"
        note = f"\n         {target['note']}" if target.get("note") else ""
        lines.append(f"  {target['status']:<5} {target['what']}: {value} (target {target['threshold']}){note}")
    return "\n".join(lines)


def render_overhead(section: dict[str, Any] | None) -> list[str]:
    if not section or "configurations" not in section:
        return note_lines("Step-time overhead", section)
    lines = [
        "",
        f"Step-time overhead: {section['measured_batches']} steady-state batches after {section['warmup_batches']}, "
        f"{section['repetitions']} repetitions interleaved; median [min-max]",
        f"  {'configuration':<30} {'step ms':>22} {'ratio to bare':>24}   {'quickest 10 ms':>14}",
    ]
    for name, row in section["configurations"].items():
        step, ratio = row["step_ms"], row["ratio_to_bare"]
        lines.append(
            f"  {name:<30} {step['median']:>8.3f} [{step['min']:.3f}-{step['max']:.3f}]"
            f" {ratio['median']:>8.3f} [{ratio['min']:.3f}-{ratio['max']:.3f}] {(ratio['median'] - 1) * 100:+6.1f}%"
            f" {row['best_step_ms']['median']:>10.3f}"
        )
    outside = section.get("outside_windows")
    if outside:
        ratio = outside["ratio_to_always_on"]
        lines.append(
            f"  detailed preset outside its window vs always-on (median batch): {ratio['median']:.3f} "
            f"[{ratio['min']:.3f}-{ratio['max']:.3f}]; bare vs bare strayed up to {outside['noise'] * 100:.1f}%"
        )
    lines += [f"  note: {note}" for note in section.get("notes", [])]
    return lines


def render_throughput(section: dict[str, Any] | None) -> list[str]:
    if not section or not section.get("runs"):
        return note_lines("Throughput accuracy", section)
    lines = ["", "Throughput accuracy: summary/train/samples_per_sec (report.json) vs samples / wall time"]
    for row in section["runs"]:
        lines.append(
            f"  {row['configuration']:<22} {row['measured_batches']:>4} batches: reported {row['reported']:>10,.1f}/s"
            f"  independent {row['independent']:>10,.1f}/s  error {row['error_pct']:+.3f}%"
        )
    return lines


def render_sink(section: dict[str, Any] | None) -> list[str]:
    if not section or "sqlite" not in section:
        return note_lines("MLflow sink cost", section)
    lines = [
        "",
        f"MLflow sink cost on the training thread: always-on set, logging every {section['log_every_n_steps']} "
        f"batches, sending every {section['flush_interval_s']} s; our hooks' time per batch in us "
        "(wall: mean median p99 max; CPU: mean; net = mean minus the timer's own cost)",
        f"  {'store':<30} {'mean':>7} {'median':>7} {'p99':>7} {'max':>8} {'CPU':>6} {'net':>6} {'step ms':>8}"
        "  delivered  end of fit",
    ]
    for key, label in (("sqlite", "local sqlite"), ("slow_server", f"mlflow server +{section['delay_s']:g} s/request")):
        row = section.get(key) or {}
        hooks = row.get("hooks")
        if not hooks or not hooks.get("batches"):
            lines.append(f"  {label:<30} {row.get('note', 'not measured')}")
            continue
        wall, cpu = hooks["wall_us"], hooks["cpu_us"]
        delivered = f"{row['probe_points_delivered']}/{row['probe_points_expected']}"
        lines.append(
            f"  {label:<30} {wall['mean']:>7.1f} {wall['median']:>7.1f} {wall['p99']:>7.1f} {wall['max']:>8.1f} "
            f"{cpu['mean']:>6.1f} {hooks['net_wall_mean_us']:>6.1f} {row['step_ms']:>8.3f}  {delivered:>9}  "
            f"{row['end_of_fit_s']:>8.2f} s"
        )
    floor = (section.get("sqlite") or {}).get("hooks", {}).get("timer_floor_us")
    if floor:
        lines.append(
            f"  timer's own cost per batch (as many no-op callbacks): {floor['wall_mean']:.1f} us wall, "
            f"{floor['cpu_mean']:.1f} us CPU"
        )
    for key, label in (("sqlite", "sqlite"), ("slow_server", "slow server")):
        loop = (section.get(key) or {}).get("hook_loop") or {}
        if loop.get("blocks"):
            lines.append(
                f"  hook calls in a tight loop ({label}, {loop['blocks']} blocks of {loop['batches_per_block']} "
                f"batches): best {loop['best_us']:.1f} us, median {loop['median_us']:.1f} us per batch"
            )
    return lines


def render_cost(section: dict[str, Any] | None) -> list[str]:
    if not section or "shipped" not in section:
        return note_lines("Always-on cost per step", section)
    lines = [
        "",
        "Always-on cost per step, each part a ratio of times taken a moment apart (see docs/benchmarks.md)",
        f"  {'set':<10} {'hooks us':>9} {'bare step us':>13} {'hooks %':>8} {'threads %':>10} {'total %':>8}"
        f"  {'MLflow sender CPU per fit (other core)':>40}",
    ]
    for name, row in section.items():
        lines.append(
            f"  {name:<10} {row['training_thread_us']:>9.1f} {row['bare_step_us']:>13.1f} "
            f"{row['training_thread_pct']:>8.2f} {row['background_threads_pct']:>10.2f} {row['overhead_pct']:>8.2f}"
            f"  {row['sender_process_cpu_s_per_fit']:>38.1f} s"
        )
    return lines


def render_trace(section: dict[str, Any] | None, reports: dict[str, Any] | None) -> list[str]:
    if not section or "ours" not in section:
        return note_lines("Trace cost", section)
    window = section["window"]
    lines = [
        "",
        f"Trace of one window ({window['active']} active steps, batches {window['first_batch']}-"
        f"{window['last_batch']}, record_shapes + profile_memory)",
        f"  {'':<12} {'file MB':>8} {'JSON MB':>8} {'window extra ms':>16} {'slowest step ms':>16} {'median ms':>10}",
    ]
    for key, label in (("ours", "ours (gzip)"), ("lightning", "Lightning")):
        row = section[key]
        file_mb = row.get("trace_gz_bytes", row.get("trace_json_bytes", 0)) / 1e6
        json_mb = row.get("trace_json_bytes", 0) / 1e6
        lines.append(
            f"  {label:<12} {file_mb:>8.2f} {json_mb:>8.2f} {row['window_extra_ms']:>16.1f} "
            f"{row['slowest_window_step_ms']:>16.1f} {row['median_step_ms']:>10.3f}"
        )
    if "size_ratio_lightning_json_to_ours_gz" in section:
        lines.append(
            f"  Lightning's JSON is {section['size_ratio_lightning_json_to_ours_gz']:.1f}x our file; our background "
            f"gzip of that JSON took {section['gzip_of_lightning_trace_s']:.2f} s"
        )
    if section.get("note"):
        lines.append(f"  note: {section['note']}")
    if reports and reports.get("build_reports_s") is not None:
        lines.append(
            f"End-of-run reports from that window: build {reports['build_reports_s'] * 1000:.0f} ms, "
            f"report.txt/json {(reports.get('write_report_s') or 0) * 1000:.0f} ms ({', '.join(reports['files'])})"
        )
    return lines


def render_hta(section: dict[str, Any] | None) -> list[str]:
    if not section or not section.get("runs"):
        return note_lines("HTA analysis time", section)
    lines = ["", f"HTA analysis time vs ranks (copies of {Path(section['fixture']).name})"]
    for row in section["runs"]:
        failed = f", failed: {', '.join(row['failed'])}" if row["failed"] else ""
        load = row["load_traces_s"]
        subset = f", {row['analysed']} analysed" if row.get("analysed", row["ranks"]) != row["ranks"] else ""
        memory = f", peak {row['peak_rss_mb']:.0f} MB" if row.get("peak_rss_mb") else ""
        lines.append(
            f"  {row['ranks']:>2} rank(s){subset}: {row['seconds']:6.1f} s (loading "
            f"{load if load is not None else 'n/a'} s{memory}), ran {len(row['ran'])} analyses{failed}"
        )
    return lines


def render_detailed(section: dict[str, Any] | None) -> list[str]:
    if not section or "files" not in section:
        return note_lines("Detailed preset", section)
    lines = ["", f"Detailed preset end to end ({section['step_ms']:.2f} ms/step over the measured steps)"]
    for key, value in section["files"].items():
        size = value if isinstance(value, str) else f"{value['bytes'] / 1e6:.2f} MB"
        lines.append(f"  {key:<16} {size}")
    memory = section.get("memory_report") or {}
    if memory.get("profiled_steps"):
        totals = memory["profiled_steps"]
        lines.append(f"  profiled steps: peak allocated {totals.get('peak_allocated_mb', 0):.0f} MB")
    metrics = section.get("system_metrics") or {}
    lines.append(f"  system metrics: {metrics.get('keys', 0)} keys, NVML {metrics.get('nvml', metrics.get('note'))}")
    energy = ", ".join(f"{key.rsplit('/', 1)[-1]} {value:.4g}" for key, value in metrics.get("energy", {}).items())
    lines.append(f"  energy: {energy or 'none (no GPU energy counter read)'}")
    hta = section.get("hta") or {}
    for window in hta.get("windows", []):
        failed = f", FAILED {', '.join(window['failed'])}" if window["failed"] else ""
        lines.append(f"  HTA {window['window'] or 'traces'}: ran {', '.join(window['ran']) or 'nothing'}{failed}")
        if not window["ran"] and window["skipped"]:
            lines.append(f"    ({next(iter(window['skipped'].values()))})")
    if hta.get("note"):
        lines.append(f"  HTA: {hta['note']}")
    return lines


def render_short_run(section: dict[str, Any] | None) -> list[str]:
    if not section or "fit" not in section:
        return note_lines("Short run", section)
    fit, script, delivered = section["fit"], section["script"], section["delivered"]
    return [
        "",
        f"Short run ({section['spec']}, {section['steps']} steps, {section['repetitions']} interleaved repetitions; "
        "medians)",
        f"  fit(): bare {fit['bare_s']:.2f} s, ours {fit['ours_s']:.2f} s: {fit['extra_s']:+.2f} s "
        f"(bare vs bare {fit['control_s']:+.2f} s)",
        "    the profiled fits' end (s): "
        + ", ".join(f"{step} {s:.2f}" for step, s in fit["end_s"].items() if s >= 0.005),
        f"    then wait_for_mlflow(), the MLflow delivery left to the background: {fit['delivery_after_fit_s']:.2f} s",
        f"  a script that fits and exits: bare {script['bare_s']:.2f} s, ours {script['ours_s']:.2f} s: "
        f"{script['extra_s']:+.2f} s (bare vs bare {script['control_s']:+.2f} s); "
        f"its fit() {script['fit_extra_s']:+.2f} s",
        f"  MLflow after the last profiled fit: {delivered['status']}, "
        f"{delivered['metrics'] - len(delivered['absent'])}/{delivered['metrics']} metrics; "
        f"spool left behind: {delivered['spool_left']}",
    ]


def render_window_end(section: dict[str, Any] | None) -> list[str]:
    if not section or "end_ms_median" not in section:
        return note_lines("Window end", section)
    ends, sizes = section["end_ms_median"], section["sizes"]
    lines = [
        "",
        f"Window end ({sizes['layers']} Linear(8, 8)+ReLU layers, {sizes['active']} active steps, "
        f"{section['repetitions']} alternated repetitions; medians)",
        f"  the window's end: ours {ends['ours']:.0f} ms, torch.profiler alone {ends['torch']:.0f} ms: "
        f"{section['end_ratio']:.2f}x (target <= {section['targets']['end_ratio_at_most']})",
        f"  longest of the {sizes['after']} steps after: ours {section['ours_after_max_ms_median']:.0f} ms "
        f"(within {section['targets']['after_step_at_most_ms']}: {section['ours_after_within_bound']}), "
        f"torch alone {section['torch_after_max_ms_median']:.0f} ms",
        "  ours on the training thread (ms): "
        + ", ".join(f"{part} {ms:.0f}" for part, ms in section["ours_parts_ms_median"].items()),
    ]
    if "fit_end_ms_median" in section:
        fit_end = section["fit_end_ms_median"]
        without = f", ours without them {fit_end['ours_no_reports']:.0f} ms" if "ours_no_reports" in fit_end else ""
        lines.append(
            f"  from the last batch to fit() returning: ours {fit_end['ours']:.0f} ms (time and memory reports)"
            f"{without}, torch alone {fit_end['torch']:.0f} ms"
        )
    return lines


def note_lines(title: str, section: dict[str, Any] | None) -> list[str]:
    return ["", f"{title}: {(section or {}).get('note', 'not run')}"]


def fmt_load(load: Any) -> str:
    return "/".join(f"{value:.1f}" for value in load) if load else "n/a"
