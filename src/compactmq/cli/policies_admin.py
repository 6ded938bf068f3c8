"""``set-``, ``get-`` and ``remove-<verb>`` commands for topic and namespace policies.

Nothing about a particular policy is written here: each is declared once, with its REST path and
its pulsar-admin verb, flags and rendering, in ``compactmq.admin.policies``; this module turns
every declaration that applies to a target ("topic" or "namespace") into three commands that
each make one REST call. Namespace-only policies with their own REST handlers (auto topic
creation, offload) pass their (path, ``CliForm``) pairs explicitly.
"""

from __future__ import annotations

from typing import Callable, Iterable

from ..admin.policies import CliForm, cli_forms
from .admin_client import run_command


def add_policy_commands(
    sub, target: str, path_of: Callable[[str], str], forms: Iterable[tuple[str, CliForm]] | None = None
) -> None:
    """``set-|get-|<remove>-<verb>`` for each (REST path suffix, CLI form) of ``forms`` on ``target``
    ("topic" or "namespace"); by default, every declared policy ``target`` has (``admin.policies``)."""
    set_method_attr = "topic_set_method" if target == "topic" else "namespace_set_method"
    for suffix, form in cli_forms(target) if forms is None else forms:
        set_help, get_help, remove_help = form.helps or (
            f"set the {form.verb} policy of a {target}",
            f"show the {form.verb} policy of a {target}",
            f"remove the {form.verb} policy of a {target}",
        )
        p = sub.add_parser(f"set-{form.verb}", help=set_help)
        p.add_argument(target)
        form.add_args(p)

        # getattr(a, target): the positional argument this command defined ("topic" or "namespace")
        def set_policy(a, c, o, form=form, suffix=suffix) -> None:
            path = f"{path_of(getattr(a, target))}/{suffix}"
            c.request(getattr(form, set_method_attr), path, form.body_from_args(a))
            o.done(f"{form.verb} set on {getattr(a, target)}")

        p.set_defaults(func=run_command(set_policy))
        p = sub.add_parser(f"get-{form.verb}", help=get_help)
        p.add_argument(target)

        def get_policy(a, c, o, form=form, suffix=suffix) -> None:
            o.result(c.request("GET", f"{path_of(getattr(a, target))}/{suffix}"), form.render)

        p.set_defaults(func=run_command(get_policy))
        p = sub.add_parser(f"{form.remove_verb}-{form.verb}", help=remove_help)
        p.add_argument(target)

        def remove_policy(a, c, o, form=form, suffix=suffix) -> None:
            c.request("DELETE", f"{path_of(getattr(a, target))}/{suffix}")
            o.done(f"{form.verb} removed from {getattr(a, target)}")

        p.set_defaults(func=run_command(remove_policy))
