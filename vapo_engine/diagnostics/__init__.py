"""Diagnostics: a knowledge base kept as data (`rules_*.json`) and a pure evaluator over `Evidence`.

    ev = gather_evidence(status=401, body=..., settings_path="settings.json", code_path=".")
    diagnosis = diagnose(ev)          # ranked findings: cause, evidence, fix

Adding a domain (e.g. training metrics): register predicates with `@predicate` in a module imported below
(`PREDICATE_MODULES`), put its evidence in `Evidence.extra` (or a new field), and drop a `rules_<domain>.json`
next to this file — `load_rules()` picks up every `rules_*.json` and validates it against the registry.
"""
from importlib import import_module

from .engine import Diagnosis, Finding, diagnose, evaluate, render
from .evidence import (
    CodeHit,
    DotenvFacts,
    Evidence,
    KeyFacts,
    ProxyFacts,
    URLFacts,
    key_facts,
    proxy_facts,
    url_facts,
)
from .gather import channel_facts, error_facts, gather_evidence, parse_headers, statuses_in_text, text_facts
from .predicates import FACTS, PREDICATES, close_matches, fact, predicate
from .provider_down import explain_provider_down
from .rules import Rule, RuleFileError, load_rules, parse_rule_file

PREDICATE_MODULES: list[str] = ["vapo_engine.diagnostics.training"]
"""Extra predicate modules imported at package import (training: rules over a run directory)."""
for _mod in PREDICATE_MODULES:
    import_module(_mod)

__all__ = ["FACTS", "PREDICATES", "CodeHit", "Diagnosis", "DotenvFacts", "Evidence", "Finding", "KeyFacts",
           "ProxyFacts", "Rule", "RuleFileError", "URLFacts", "channel_facts", "close_matches", "diagnose",
           "error_facts", "evaluate", "explain_provider_down", "fact", "gather_evidence", "key_facts",
           "load_rules", "parse_headers", "parse_rule_file", "predicate", "proxy_facts", "render", "statuses_in_text", "text_facts", "url_facts"]
