"""The few building blocks every Interlude dashboard uses, on top of grafana-foundation-sdk.

Every query filters on the dashboard's `namespace` and `release` variables: the chart's
monitors copy each pod's `app.kubernetes.io/instance` label onto its series as
`app_kubernetes_io_instance`, so two releases in one namespace stay apart. Panels get ids and
query refIds here, in order, so the JSON is the same on every run.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, table, tempo, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import tempo as tm

PROMETHEUS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
TEMPO = dm.DataSourceRef(type_val="tempo", uid="${tempo}")
# The series of this release: every query's label filter.
SEL = 'namespace="$namespace", app_kubernetes_io_instance=~"$release"'
# The span services' names (interlude.telemetry.setup_tracing's `service`).
GATEWAY_SERVICE = "interlude-gateway"


def rate(metric: str, extra: str = "", by: str = "") -> str:
    """`sum [by (...)] (rate(metric{SEL, extra}[$__rate_interval]))`."""
    labels = f"{SEL}, {extra}" if extra else SEL
    group = f" by ({by})" if by else ""
    return f"sum{group} (rate({metric}{{{labels}}}[$__rate_interval]))"


def quantile(q: float, histogram: str, by: str = "") -> str:
    """The q-quantile of a histogram over the release, per `by` when given."""
    keys = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, {rate(histogram + '_bucket', by=keys)})"


def sel(metric: str, extra: str = "") -> str:
    """`metric{SEL, extra}`: an instant selector of this release's series."""
    return f"{metric}{{{SEL}, {extra}}}" if extra else f"{metric}{{{SEL}}}"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    exemplars: bool = False  # trace ids from exemplars: links to Tempo where Prometheus has them


@dataclass(frozen=True)
class Link:
    title: str
    url: str


def tempo_explore(traceql: str) -> Link:
    """A link opening Grafana Explore on the `tempo` data source with a TraceQL query, over
    the dashboard's time range."""
    pane = {
        "datasource": "${tempo}",
        "queries": [
            {
                "refId": "A",
                "datasource": {"type": "tempo", "uid": "${tempo}"},
                "queryType": "traceql",
                "query": traceql,
            }
        ],
        "range": {"from": "${__from}", "to": "${__to}"},
    }
    panes = urllib.parse.quote(json.dumps({"a": pane}, separators=(",", ":")), safe="${}_")
    return Link("Traces in Tempo", f"/explore?schemaVersion=1&panes={panes}")


@dataclass
class Board:
    """One dashboard: a title, its uid, and rows of panels, laid out 24 columns wide."""

    uid: str
    title: str
    description: str
    tags: list[str] = field(default_factory=lambda: ["interlude"])
    _builder: db.Dashboard | None = None
    _next_id: int = 1

    def __post_init__(self) -> None:
        self._builder = (
            db.Dashboard(self.title)
            .uid(self.uid)
            .description(self.description)
            .tags(self.tags)
            .timezone("browser")
            .editable()
            .refresh("30s")
            .time("now-1h", "now")
            .tooltip(dm.DashboardCursorSync.CROSSHAIR)
            .variables(variables())
            .annotation(_Built(BUILT_IN))
        )

    @property
    def builder(self) -> db.Dashboard:
        assert self._builder is not None
        return self._builder

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def row(self, title: str) -> Board:
        self.builder.with_row(db.Row(title).id(self._id()))
        return self

    def series(
        self,
        title: str,
        description: str,
        queries: list[Query],
        unit: str = "short",
        *,
        width: int = 12,
        stacked: bool = False,
        bars: bool = False,
        links: tuple[Link, ...] = (),
    ) -> Board:
        """A time series panel on the Prometheus data source."""
        panel = (
            timeseries.Panel()
            .id(self._id())
            .title(title)
            .description(description)
            .datasource(PROMETHEUS)
            .unit(unit)
            .height(8)
            .span(width)
            .min(0)
            .fill_opacity(25 if stacked else 10)
            .line_width(1)
            .draw_style(cm.GraphDrawStyle.BARS if bars else cm.GraphDrawStyle.LINE)
            .stacking(
                cb.StackingConfig().mode(
                    cm.StackingMode.NORMAL if stacked else cm.StackingMode.NONE
                )
            )
            .legend(
                cb.VizLegendOptions()
                .display_mode(cm.LegendDisplayMode.LIST)
                .placement(cm.LegendPlacement.BOTTOM)
                .show_legend(True)
            )
            .tooltip(
                cb.VizTooltipOptions()
                .mode(cm.TooltipDisplayMode.MULTI)
                .sort(cm.SortOrder.DESCENDING)
            )
        )
        for i, q in enumerate(queries):
            target = prometheus.Dataquery().ref_id(chr(ord("A") + i)).expr(q.expr).range()
            if q.legend:
                target = target.legend_format(q.legend)
            if q.exemplars:
                target = target.exemplar(True)
            panel = panel.with_target(target)
        if links:
            panel = panel.links([_link(link) for link in links])
        self.builder.with_panel(panel)
        return self

    def traces(self, title: str, description: str, traceql: str, *, width: int = 24) -> Board:
        """A table of traces from the `tempo` data source (each trace id opens the trace)."""
        panel = (
            table.Panel()
            .id(self._id())
            .title(title)
            .description(description)
            .datasource(TEMPO)
            .height(8)
            .span(width)
            .show_header(True)
            .with_target(
                tempo.TempoQuery()
                .ref_id("A")
                .datasource(TEMPO)
                .query_type(tm.TempoQueryType.TRACEQL)
                .query(traceql)
                .limit(20)
            )
        )
        self.builder.with_panel(panel)
        return self

    def annotate(self, name: str, expr: str, title: str, color: str) -> Board:
        """Marks on every panel where `expr` (a Prometheus query) has a sample."""
        self.builder.annotation(
            _Built(
                _Annotation(
                    {"titleFormat": title},
                    name=name,
                    datasource=PROMETHEUS,
                    enable=True,
                    icon_color=color,
                    expr=expr,
                )
            )
        )
        return self

    def json(self) -> str:
        return JSONEncoder(sort_keys=True, indent=2).encode(self.builder.build()) + "\n"


class _Annotation(dm.AnnotationQuery):
    """An annotation with fields the SDK's model lacks (a Prometheus query's `titleFormat`,
    Grafana's own `builtIn`)."""

    def __init__(self, extra: dict[str, object], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.extra = extra

    def to_json(self) -> dict[str, object]:
        return {**super().to_json(), **self.extra}


# Grafana's own annotations and alerts, which every dashboard it saves carries.
BUILT_IN = _Annotation(
    {"builtIn": 1},
    name="Annotations & Alerts",
    datasource=dm.DataSourceRef(type_val="grafana", uid="-- Grafana --"),
    enable=True,
    hide=True,
    icon_color="rgba(0, 211, 255, 1)",
    type_val="dashboard",
)


class _Built(cogbuilder.Builder[dm.AnnotationQuery]):
    """An already built object, handed to a builder that wants a builder."""

    def __init__(self, built: dm.AnnotationQuery) -> None:
        self._built = built

    def build(self) -> dm.AnnotationQuery:
        return self._built


def _link(link: Link) -> db.DashboardLink:
    return (
        db.DashboardLink(link.title)
        .type(dm.DashboardLinkType.LINK)
        .url(link.url)
        .target_blank(True)
        .keep_time(False)
        .include_vars(False)
    )


def variables() -> list[cogbuilder.Builder[dm.VariableModel]]:
    """Prometheus and Tempo data sources, then the namespace and the release to show."""
    refresh = dm.VariableRefresh.ON_TIME_RANGE_CHANGED
    return [
        db.DatasourceVariable("datasource").label("Prometheus").type("prometheus"),
        db.DatasourceVariable("tempo").label("Tempo").type("tempo"),
        db.QueryVariable("namespace")
        .label("Namespace")
        .datasource(PROMETHEUS)
        .query("label_values(interlude:gateway_requests_total, namespace)")
        .refresh(refresh)
        .sort(dm.VariableSort.ALPHABETICAL_ASC),
        db.QueryVariable("release")
        .label("Release")
        .datasource(PROMETHEUS)
        .query(
            'label_values(interlude:gateway_requests_total{namespace="$namespace"}, '
            "app_kubernetes_io_instance)"
        )
        .refresh(refresh)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .include_all(True)
        .all_value(".*"),
    ]
