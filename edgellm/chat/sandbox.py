"""A jinja2 sandbox for untrusted chat templates: Hugging Face's environment plus bounds on time and size.

The environment mirrors transformers' `_compile_jinja_template`
(src/transformers/utils/chat_template_utils.py): `ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True)` with `loopcontrols`, a `{% generation %}` tag, `raise_exception`, `strftime_now`
and a `tojson` filter that does not HTML-escape. What it adds is a `Budget` per render, enforced from
hooks compiled into the template itself (so they also stop loops whose bodies call nothing): every loop
iteration, macro call, method call and filter checks a deadline; every value a template builds (strings,
lists, dicts, big integers) and every character it writes is counted against a size limit, *before* the
C code that would allocate it runs where that matters. A template that escapes, spins or bloats gets a
`ChatTemplateError`; nothing else in the process is affected.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer

# Integers may not grow past this many bits (`10 ** 10 ** 10` would otherwise hang inside C).
MAX_INT_BITS = 1 << 16
MAX_JSON_ITEMS = 100_000  # items of a sequence (a map's generator) the `tojson` filter takes
# `indent` of the `tojson` filter: real templates use 2 or 4; a huge one multiplies the output.
MAX_JSON_INDENT = 64
# Format strings (`'%99999999d' % x`, `'{:>99999999}'.format(x)`) may not ask for fields this wide.
_HUGE_WIDTH = re.compile(r"\d{7,}")
# ...nor take a width from an argument (`'%*d' % (n, x)`, `'{:{}}'.format(x, n)`) without it being checked.
_ARG_WIDTH = re.compile(r"%[-#0 +]*\*|\{[^{}]*\{")
# Filters and str methods whose int arguments are widths or counts of what they build.
_WIDTH_FILTERS = frozenset({"center", "slice", "batch", "wordwrap"})
_WIDTH_METHODS = frozenset({"ljust", "rjust", "center", "zfill"})


class ChatTemplateError(ValueError):
    """A chat template could not be compiled or rendered. `kind` says why, for callers that map it:

    syntax, raised (the template's own `raise_exception`), sandbox (it reached for something unsafe),
    timeout, too_large, messages (invalid input), override (bad --chat-template), render (anything else).
    """

    def __init__(self, message: str, kind: str = "render"):
        super().__init__(message)
        self.kind = kind


class _RaisedByTemplate(TemplateError):
    """What `raise_exception(msg)` throws, so it can be told apart from jinja's own errors."""


@dataclass
class Budget:
    """Limits of one render: a wall-clock deadline and a size bound in characters (or elements)."""

    deadline: float  # time.monotonic() value
    max_chars: int  # no value the template builds may be larger than this
    work_left: int  # characters it may write in all, including {% set %} blocks and macro bodies

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise ChatTemplateError("chat template ran past its time limit", "timeout")

    def check(self, value: Any) -> Any:
        self.tick()
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
            raise ChatTemplateError("chat template built an integer too large to use", "too_large")
        if value_size(value, self.max_chars) > self.max_chars:
            raise ChatTemplateError(
                f"chat template built a value over {self.max_chars} characters", "too_large"
            )
        return value

    def spend(self, n: int) -> None:
        self.work_left -= n
        if n > self.max_chars or self.work_left < 0:
            raise ChatTemplateError(f"chat template output is over {self.max_chars} characters", "too_large")


_budget: ContextVar[Budget | None] = ContextVar("edgellm_chat_budget", default=None)


def value_size(value: Any, limit: int) -> int:
    """Characters (strings) plus elements (containers) reachable from `value`, counting a shared object
    once per reference, as rendering it would; stops counting as soon as the total passes `limit`."""
    total = 0
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, (str, bytes)):
            total += len(v)
        elif isinstance(v, (list, tuple, dict)):
            total += len(v) + 1
            if total > limit:
                return total
            stack.extend(v.items() if isinstance(v, dict) else v)
        elif isinstance(v, Namespace):
            stack.append(object.__getattribute__(v, "_Namespace__attrs"))
        else:
            total += 1
        if total > limit:
            return total
    return total


def _check_widths(budget: Budget, args: tuple, kwargs: dict) -> None:
    """A width or count argument larger than the size limit can only make something too big."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > budget.max_chars:
            raise ChatTemplateError(
                f"chat template passed an argument of {a} (limit {budget.max_chars})", "too_large"
            )


def _check_format(budget: Budget, fmt: str, args: tuple = (), kwargs: dict | None = None) -> None:
    if _HUGE_WIDTH.search(fmt):
        raise ChatTemplateError("chat template used a format field wider than allowed", "too_large")
    if _ARG_WIDTH.search(fmt):
        _check_widths(budget, args, kwargs or {})


def _check_replace(budget: Budget, s: str, old: str, new: str) -> None:
    n = len(s) + 1 if old == "" else s.count(old)
    if len(s) + n * len(new) > budget.max_chars:
        raise ChatTemplateError("chat template's replace() would build a value too large", "too_large")


def _check_join(budget: Budget, sep: str, items: list) -> None:
    if value_size(items, budget.max_chars) + len(sep) * len(items) > budget.max_chars:
        raise ChatTemplateError("chat template's join would build a value too large", "too_large")


def _bounded_filter(name: str, f):
    """Wrap a jinja filter with the budget checks it needs; `functools.wraps` keeps its pass_context mark."""
    skip = 1 if hasattr(f, "jinja_pass_arg") else 0  # context/eval_ctx/environment comes first

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        budget = _budget.get()
        if budget is None:
            return f(*args, **kwargs)
        budget.tick()
        value, rest = (args[skip], args[skip + 1 :]) if len(args) > skip else (None, ())
        if name in _WIDTH_FILTERS:
            _check_widths(budget, rest, kwargs)
        elif name == "join" and value is not None:
            items = list(value)  # it may be a generator (`map`, `select`): materialize once, then check
            sep = rest[0] if rest else kwargs.get("d", "")
            _check_join(budget, str(sep), items)
            args = (*args[:skip], items, *rest)
        elif name == "replace" and len(rest) >= 2:
            _check_replace(budget, str(value), str(rest[0]), str(rest[1]))
        elif name == "indent" and value is not None:
            width = rest[0] if rest else kwargs.get("width", 4)
            w = len(width) if isinstance(width, str) else int(width)
            if len(str(value)) + (str(value).count("\n") + 1) * w > budget.max_chars:
                raise ChatTemplateError("chat template's indent would build a value too large", "too_large")
        elif name == "format" and value is not None:
            _check_format(budget, str(value), rest, kwargs)
        return budget.check(f(*args, **kwargs))

    return wrapper


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' tojson: json.dumps without jinja's HTML escaping, with its options exposed.
    if (isinstance(indent, int) and indent > MAX_JSON_INDENT) or (
        isinstance(indent, str) and len(indent) > MAX_JSON_INDENT
    ):
        raise ChatTemplateError(f"tojson indent over {MAX_JSON_INDENT}", "too_large")
    if isinstance(x, Iterator):  # `tools | map(attribute='function') | tojson`: minja's map gives a list
        x = list(itertools.islice(x, MAX_JSON_ITEMS + 1))
        if len(x) > MAX_JSON_ITEMS:
            raise ChatTemplateError("chat template's tojson would build a value too large", "too_large")
    budget = _budget.get()
    if budget is not None and value_size(x, budget.max_chars) > budget.max_chars:
        raise ChatTemplateError("chat template's tojson would build a value too large", "too_large")
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message):
    raise _RaisedByTemplate(str(message))


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _GenerationTag(Extension):
    """`{% generation %}…{% endgeneration %}` (transformers' AssistantTracker); here it renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _hook(name: str, args: list, lineno: int) -> nodes.Call:
    # `environment.<name>(…)`: an attribute of the environment object, which a template cannot rebind.
    return nodes.Call(nodes.EnvironmentAttribute(name, lineno=lineno), args, [], None, None, lineno=lineno)


class _Instrument(NodeTransformer):
    """Rewrites a parsed template so that it checks its own budget (see `BoundedEnvironment`)."""

    def visit_Output(self, node):
        self.generic_visit(node)
        node.nodes = [
            _hook("edgellm_emit", [nodes.Const(c.data) if isinstance(c, nodes.TemplateData) else c], c.lineno)
            for c in node.nodes
        ]
        return node

    def _tick_body(self, node):
        self.generic_visit(node)
        node.body.insert(0, nodes.Output([_hook("edgellm_tick", [], node.lineno)], lineno=node.lineno))
        return node

    def visit_For(self, node):
        node = self._tick_body(node)
        # `{% for x in xs if cond %}` iterates all of xs even if the body never runs
        if node.test is not None:
            node.test = nodes.And(_hook("edgellm_true", [], node.lineno), node.test, lineno=node.lineno)
        return node

    visit_Macro = _tick_body
    visit_CallBlock = _tick_body

    def visit_Concat(self, node):  # `a ~ b`
        self.generic_visit(node)
        return _hook("edgellm_concat", node.nodes, node.lineno)

    def _check_literal(self, node):  # `[ns.x, ns.x]` doubles in size on each pass of a loop
        self.generic_visit(node)
        if getattr(node, "ctx", "load") != "load":
            return node
        return _hook("edgellm_check", [node], node.lineno)

    visit_List = _check_literal
    visit_Tuple = _check_literal
    visit_Dict = _check_literal


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """transformers' chat-template environment, with every render bounded by the active `Budget`.

    Outside `render()` (no budget set) the hooks check nothing, and templates behave exactly as in HF.
    """

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _GenerationTag])
        self.globals.pop("lipsum", None)  # lipsum(n=10**9) writes as much text as asked
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        self.filters["tojson"] = _tojson
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}

    # -- compile: parse, then instrument (jinja's compile() calls _parse for source text) --
    def _parse(self, source, name, filename):
        tree = _Instrument().visit(super()._parse(source, name, filename))
        tree.set_environment(self)
        return tree

    def compile_template(self, source: str):
        try:
            return self.from_string(source)
        except TemplateSyntaxError as e:
            raise ChatTemplateError(
                f"chat template syntax error at line {e.lineno}: {e.message}", "syntax"
            ) from None
        except (TemplateError, RecursionError, MemoryError) as e:
            raise ChatTemplateError(f"chat template does not compile: {e}", "syntax") from None

    # -- hooks compiled into templates --
    def edgellm_tick(self) -> str:
        budget = _budget.get()
        if budget is not None:
            budget.tick()
        return ""

    def edgellm_true(self) -> bool:
        self.edgellm_tick()
        return True

    def edgellm_emit(self, value):
        budget = _budget.get()
        if budget is not None:
            budget.tick()
            # measure before jinja calls str() on it: str() of a shared-reference list can be huge
            budget.spend(len(value) if isinstance(value, str) else value_size(value, budget.max_chars))
        return value

    def edgellm_concat(self, *parts) -> str:
        budget = _budget.get()
        if budget is None:
            return "".join(map(str, parts))
        budget.check(list(parts))
        return budget.check("".join(map(str, parts)))

    def edgellm_check(self, value):
        budget = _budget.get()
        return value if budget is None else budget.check(value)

    # -- sandbox overrides --
    def unsafe_undefined(self, obj, attribute):
        # jinja returns a silent Undefined here; a template probing for `__class__` gets an error instead.
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def wrap_str_format(self, value):
        # jinja swaps str.format/format_map for a sandboxed formatter when they are looked up; check the
        # format string first, since '{:>999999999}' allocates before anything else can look at it.
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None

        @functools.wraps(wrapped)
        def checked(*args, **kwargs):
            budget = _budget.get()
            if budget is not None:
                _check_format(budget, value.__self__, args, kwargs)
            return wrapped(*args, **kwargs)

        return checked

    def call(self, context, obj, /, *args, **kwargs):
        budget = _budget.get()
        if budget is None:
            return super().call(context, obj, *args, **kwargs)
        if getattr(obj, "__self__", None) is self:  # our own hooks (jinja adds _loop_vars/_block_vars)
            return obj(*args)
        budget.tick()
        owner = getattr(obj, "__self__", None)
        if isinstance(owner, str):
            method = getattr(obj, "__name__", "")
            if method in _WIDTH_METHODS:
                _check_widths(budget, args, kwargs)
            elif method == "replace" and len(args) >= 2:
                _check_replace(budget, owner, str(args[0]), str(args[1]))
            elif method == "join" and args:
                items = list(args[0])
                _check_join(budget, owner, items)
                args = (items, *args[1:])
            elif method == "expandtabs":
                size = args[0] if args else kwargs.get("tabsize", 8)
                if len(owner) + owner.count("\t") * max(int(size), 0) > budget.max_chars:
                    raise ChatTemplateError(
                        "chat template's expandtabs would build a value too large", "too_large"
                    )
        return budget.check(super().call(context, obj, *args, **kwargs))

    def call_binop(self, context, operator, left, right):
        budget = _budget.get()
        if budget is not None:
            budget.tick()
            _check_binop(budget, operator, left, right)
            return budget.check(super().call_binop(context, operator, left, right))
        return super().call_binop(context, operator, left, right)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_binop(budget: Budget, op: str, left, right) -> None:
    """Refuse `*`, `**`, `+`, `%` whose result would be too large, before Python computes it."""
    too_large = ChatTemplateError(f"chat template's {op!r} would build a value too large", "too_large")
    if op == "**":
        if _is_int(left) and _is_int(right) and abs(left) > 1 and right > 0:
            if left.bit_length() * right > MAX_INT_BITS:
                raise too_large
    elif op == "*":
        if _is_int(left) and _is_int(right):
            if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise too_large
        elif _is_int(left) or _is_int(right):
            n, seq = (left, right) if _is_int(left) else (right, left)
            if n > 0 and isinstance(seq, (str, bytes, list, tuple)):
                if n > budget.max_chars or n * value_size(seq, budget.max_chars) > budget.max_chars:
                    raise too_large
    elif op == "+":
        if not (_is_int(left) or isinstance(left, float)):
            if value_size(left, budget.max_chars) + value_size(right, budget.max_chars) > budget.max_chars:
                raise too_large
    elif op == "%" and isinstance(left, str):
        _check_format(budget, left, right if isinstance(right, tuple) else (right,))
        if value_size(left, budget.max_chars) + value_size(right, budget.max_chars) > budget.max_chars:
            raise too_large


def render_bounded(template, context: dict, *, max_seconds: float, max_chars: int) -> str:
    """Render a template compiled by `BoundedEnvironment` under a fresh budget; every failure is a
    `ChatTemplateError` (the template's own `raise_exception` message is kept verbatim)."""
    # Everything written counts once for the output and again for each {% set %}/macro it passed through.
    budget = Budget(deadline=time.monotonic() + max_seconds, max_chars=max_chars, work_left=8 * max_chars)
    token = _budget.set(budget)
    try:
        out, n = [], 0
        for chunk in template.generate(context):
            n += len(chunk)
            if n > max_chars:
                raise ChatTemplateError(f"chat template output is over {max_chars} characters", "too_large")
            out.append(chunk)
        return "".join(out)
    except ChatTemplateError:
        raise
    except _RaisedByTemplate as e:
        raise ChatTemplateError(e.message or "chat template raised an exception", "raised") from None
    except SecurityError as e:
        raise ChatTemplateError(f"chat template blocked by the sandbox: {e}", "sandbox") from None
    except (RecursionError, MemoryError) as e:
        raise ChatTemplateError(
            f"chat template recursed or allocated too much ({type(e).__name__})", "too_large"
        ) from None
    except Exception as e:  # a template can fail in any way Python can; all are the template's fault
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}", "render") from None
    finally:
        _budget.reset(token)
