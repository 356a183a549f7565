"""The chart library of the report page: Plotly's JavaScript bundle, from the `plotly` package
(the optional extra `parplan[report]`, imported here only). The bundle is embedded in the page,
so the charts draw offline; the page's script (report_page.js) draws them from the data.
"""

from __future__ import annotations

MISSING = "charts need plotly (pip install 'parplan[report]'); the tables are complete"


def load_chart_library() -> tuple[str | None, str | None]:
    """(Plotly's minified bundle, None), or (None, why there are no charts)."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        return None, MISSING
    return get_plotlyjs(), None
