"""The tool pods' egress NetworkPolicy: DNS, the chart's Valkey, its OTLP receiver, and
`networkPolicy.toolsEgress`; never the cloud metadata address unless a user's rule says so.

(kubernetes-validate checks the rendered policies in test_chart.py, the `tools-egress` case
with a user rule among them.)
"""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from .conftest import CASES, CHART, Manifest, by_kind, name, run_helm

METADATA = ipaddress.ip_address("169.254.169.254")
DNS = {
    "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
    "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
}  # fmt: skip


def _to(component: str, port: int) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "interlude", "app.kubernetes.io/instance": "rel"}
    selector = {"matchLabels": {**labels, "app.kubernetes.io/component": component}}
    return {"to": [{"podSelector": selector}], "ports": [{"port": port, "protocol": "TCP"}]}


def _egress(docs: tuple[Manifest, ...]) -> list[dict[str, Any]]:
    spec = by_kind(docs, "NetworkPolicy")[name("tools")]["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    rules: list[dict[str, Any]] = spec["egress"]
    return rules


def _reaches(
    rules: list[dict[str, Any]], address: ipaddress.IPv4Address | ipaddress.IPv6Address
) -> bool:
    """Whether any rule lets the pod connect to `address` (outside the cluster's pods)."""
    for rule in rules:
        if not rule.get("to"):
            return True  # no peers: every destination
        for peer in rule["to"]:
            if "ipBlock" not in peer:
                continue  # a pod or namespace selector: pods, not an outside address
            block = peer["ipBlock"]
            excepted = any(address in ipaddress.ip_network(e) for e in block.get("except", []))
            if address in ipaddress.ip_network(block["cidr"]) and not excepted:
                return True
    return False


def test_by_default_tool_pods_reach_dns_and_valkey_only(render: Any) -> None:
    assert _egress(render()) == [DNS, _to("redis", 6379)]
    # The other components' egress stays open (weights, the API server): Ingress-only.
    for component in ("gateway", "engine", "redis"):
        policy = by_kind(render(), "NetworkPolicy")[name(component)]
        assert policy["spec"]["policyTypes"] == ["Ingress"], component


# values-minimal.yaml turns NetworkPolicies off (kind and minikube enforce none by default).
@pytest.mark.parametrize("case", [c for c in CASES if c != "tools-egress" and "minimal" not in c])
def test_no_default_reaches_the_metadata_address(render: Any, case: str) -> None:
    rules = _egress(render(*CASES[case]))
    assert all(rule["to"] for rule in rules)
    assert not any("ipBlock" in peer for rule in rules for peer in rule["to"])
    assert not _reaches(rules, METADATA)


def test_the_metadata_check_can_fail() -> None:
    wide = [{"to": [{"ipBlock": {"cidr": "169.254.0.0/16"}}]}]
    assert _reaches(wide, METADATA) and _reaches([{"ports": [{"port": 80}]}], METADATA)
    wide[0]["to"][0]["ipBlock"]["except"] = ["169.254.169.254/32"]
    assert not _reaches(wide, METADATA)


def test_spans_go_to_the_charts_own_receiver(render: Any) -> None:
    collector = _egress(render("--set", "tracing.collector.enabled=true,tempo.enabled=true"))
    assert collector[2:] == [_to("otel-collector", 4318)]
    assert _egress(render("--set", "tempo.enabled=true"))[2:] == [_to("tempo", 4318)]
    # An endpoint of the user's own is the user's to allow (toolsEgress).
    endpoint = "tracing.collector.enabled=true,tracing.otlpEndpoint=http://otel.monitoring:4318"
    assert _egress(render("--set", endpoint)) == [DNS, _to("redis", 6379)]


def test_tools_egress_adds_the_users_rules(render: Any) -> None:
    rules = _egress(render(*CASES["tools-egress"]))
    assert rules[:3] == [DNS, _to("redis", 6379), _to("tempo", 4318)]
    (https,) = rules[3:]
    assert https["ports"] == [{"port": 443, "protocol": "TCP"}]
    assert _reaches(rules, ipaddress.ip_address("203.0.113.7"))
    assert not _reaches(rules, METADATA)  # excepted by the rule itself


def test_with_an_external_redis_the_user_names_it(render: Any) -> None:
    docs = render("--set", "redis.enabled=false,externalRedis.existingSecret=my-redis")
    assert _egress(docs) == [DNS]


REFUSED = {
    "no peers": '[{"ports": [{"port": 443}]}]',
    "empty peers": '[{"to": []}]',
    "empty peer": '[{"to": [{}]}]',
    "unknown key": '[{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "from": []}]',
}


@pytest.mark.parametrize("rule", REFUSED.values(), ids=REFUSED)
def test_the_schema_refuses_a_rule_that_would_open_everything(helm: str, rule: str) -> None:
    setting = f"networkPolicy.toolsEgress={rule}"
    out = run_helm(helm, "template", "rel", str(CHART), "--set-json", setting)
    assert out.returncode != 0 and "toolsEgress" in out.stderr, out.stderr
