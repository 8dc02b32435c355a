"""Self-contained HTML reports: every figure embedded as a PNG data URI, no script, nothing loaded
from the network, so one file reads offline and mails as one attachment. Used by `evidence` and
`replay --html`."""

from __future__ import annotations

import base64
import html
import io
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = """body{font:15px/1.45 system-ui,sans-serif;max-width:62em;margin:1.5em auto;padding:0 1em;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em;margin:.6em 0}td,th{padding:.2em .6em;border-bottom:1px solid #e4e4e4;
text-align:left}th{background:#f6f6f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
.reading{background:#f4f7fb;border-left:4px solid #3b6fb6;padding:.5em .8em}.verdict{font-weight:600}
.missing{color:#8a4b00}img{max-width:100%}small{color:#666}"""


def png_uri(fig) -> str:
    """A matplotlib figure as a `data:image/png;base64,...` URI (the figure is closed)."""
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def file_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()


def table(head: list[str], rows: list[list], cls: str = "") -> str:
    def cell(v):
        if isinstance(v, float):
            return f'<td class="num">{v:.4g}</td>'
        if isinstance(v, int):
            return f'<td class="num">{v}</td>'
        return f"<td>{html.escape(str(v))}</td>"
    return (f'<table class="{cls}"><thead><tr>' + "".join(f"<th>{html.escape(h)}</th>" for h in head) +
            "</tr></thead><tbody>" + "".join("<tr>" + "".join(cell(v) for v in r) + "</tr>" for r in rows) +
            "</tbody></table>")


def section(sid: str, title: str, reading: str, figures: list[str] = (), body: str = "", verdict: str = "") -> str:
    """One answer: its title, its reading (plain text), its verdict, figures (data URIs), body HTML."""
    imgs = "".join(f'<p><img alt="{html.escape(title)}" src="{u}"></p>' for u in figures)
    v = f'<p class="verdict" data-verdict="{html.escape(verdict)}">{html.escape(verdict)}</p>' if verdict else ""
    return (f'<section id="{html.escape(sid)}"><h2>{html.escape(title)}</h2>{v}'
            f'<p class="reading">{html.escape(reading)}</p>{imgs}{body}</section>')


def page(title: str, intro: str, sections: list[str]) -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f'<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1><p>{intro}</p>'
            + "".join(sections) + "</body></html>\n")


def replay_page(report, results, path: Path, trace_name: str = "") -> Path:
    """`replay --html`: the replay's table and every plot of `--plots`, in one file."""
    from .plots import write_plots

    rows = []
    for name, r in report.policies.items():
        rows.append([name, r.handoff_stall_s.p95, r.handoff_stall_s.p99, r.ttft_s.p95,
                     r.slo_attainment.get("5", float("nan")), r.program_latency_s.p95, r.stall_total_s, r.warm_tax,
                     r.wasted_bytes / 1e12, r.calls_completed])
    with tempfile.TemporaryDirectory() as tmp:
        figs = [file_uri(p) for p in write_plots(results, tmp)]
    run = report.run.model_dump() if getattr(report, "run", None) is not None else {}
    tr = report.trace
    intro = html.escape(f"trace {trace_name or '?'} ({tr.programs} programs, {tr.calls} calls, {tr.handoffs} handoffs) "
                        f"· cluster {report.cluster} · catalog {report.catalog} · start {run.get('start')} "
                        f"· warm-up {run.get('warmup_s')} s · seed {run.get('seed')}")
    body = table(["policy", "handoff P95 s", "handoff P99 s", "TTFT P95 s", "SLO@5", "program P95 s", "total stall s",
                  "warm tax", "wasted TB", "calls"], rows, "policies")
    o = report.oracle
    if o is not None and o.bound_total_stall_s is not None:
        body += (f'<p class="bound">Lower bound on total stall: {o.bound_total_stall_s:.2f} s '
                 f'({html.escape(o.bound_status)}).</p>')
    if o is not None and o.behind is not None:
        body += f'<p class="behind">{html.escape(o.behind.why)}</p>'
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page("StateBudget replay", intro, [section("table", "Per policy", "Figures of the report "
                                                                "(`replay --json` holds every field). Lower is better "
                                                                "but for SLO@5 (share of calls within 5x their ideal "
                                                                "TTFT).", figs, body)]))
    return path
