"""One request's chat plan: the prompt, the grammar, the lazy grammar's markers and the output parser.

`prepare()` runs before a model is loaded and checks everything a client can
get wrong (tool definitions, `tool_choice`, JSON Schemas, `call_id`s of tool
results), compiling the schemas into GBNF rules. `build_plan()` then renders
the conversation for the loaded model's family and assembles the grammar:

- `tool_choice` `required` or a named function: decoding starts constrained
  to the family's call syntax with schema-valid arguments;
- `auto`: free text, and once the model writes the family's call-open marker
  a lazy grammar constrains the rest of the call (the engine watches for the
  marker, `engine.trigger`, and says when it switched the grammar on);
- structured output: the JSON of the schema, after an optional (or, when the
  prompt already opened one, mandatory) thinking block;
- `none`: no tools in the prompt and no call parsing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from lmsp_tray.chat import dialects
from lmsp_tray.chat.dialects import CallSyntax, Dialect
from lmsp_tray.chat.gbnf import Grammar, literal, text_without
from lmsp_tray.chat.parser import OutputParser, ParserConfig
from lmsp_tray.chat.prefix import stable_chars
from lmsp_tray.chat.schema import SchemaCompiler, SchemaError, path_text
from lmsp_tray.errors import InvalidRequest, quote
from lmsp_tray.protocol.requests import FunctionCall, FunctionCallOutput, ResponseRequest, Tool

TOOL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class ChatModel(Protocol):
    """What a plan needs from a loaded model (`engine.loaded.LoadedModel` provides it)."""

    template: Any  # engine.templates.ChatTemplate: .source, .name, .render()
    sliding_window: bool  # only such a model checkpoints at the stable prefix: others need not find it

    def find_token(self, text: str) -> int | None: ...  # pragma: no cover
    def is_control(self, token: int) -> bool: ...  # pragma: no cover


@dataclass
class OutputSpec:
    """The validated tools, tool choice and schemas of a request, compiled into GBNF rules."""

    grammar: Grammar
    tools: list[Tool]
    choice: str | dict[str, str]
    arg_rules: dict[str, str]  # tool name -> rule for its arguments
    json_rule: str | None  # structured output
    parallel: bool | None  # parallel_tool_calls as sent (None: the family's habit decides)

    @property
    def calls(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> bool:
        return self.calls and self.choice != "auto"

    def allowed(self) -> list[str]:
        if isinstance(self.choice, dict):
            return [self.choice["name"]]
        return [t.name for t in self.tools]


def _schema_param(request: ResponseRequest) -> str:
    fmt = request.raw.get("response_format") if isinstance(request.raw, dict) else None
    if isinstance(fmt, dict):
        return "response_format.json_schema.schema" if "json_schema" in fmt else "response_format.schema"
    return "text.format.schema"


def _param(prefix: str, path: tuple[Any, ...]) -> str:
    rest = path_text(path)
    if not rest:
        return prefix
    return prefix + (rest if rest.startswith("[") else "." + rest)


def prepare(request: ResponseRequest) -> OutputSpec:
    """Check tools, tool_choice, schemas and tool results; compile the schemas. Raises InvalidRequest."""
    g = Grammar()
    seen: dict[str, int] = {}
    arg_rules: dict[str, str] = {}
    for i, tool in enumerate(request.tools):
        if not TOOL_NAME_RE.match(tool.name):
            raise InvalidRequest(
                f"Tool name '{tool.name}' must be 1-64 letters, digits, '_' or '-'.", param=f"tools[{i}].name"
            )
        if tool.name in seen:
            raise InvalidRequest(
                f"Tool name '{tool.name}' is used by tools[{seen[tool.name]}] already; names must be unique.",
                param=f"tools[{i}].name",
            )
        seen[tool.name] = i
        params = tool.parameters
        kind = params.get("type") if isinstance(params, dict) else None
        if not isinstance(params, dict) or (kind != "object" and not (kind is None and "properties" in params)):
            raise InvalidRequest(
                'A tool\'s \'parameters\' must be a JSON Schema for an object ({"type": "object", '
                '"properties": {...}}).',
                param=f"tools[{i}].parameters",
            )
        try:
            arg_rules[tool.name] = SchemaCompiler(g, params, name=f"fn{i}-args").compile()
        except SchemaError as exc:
            where = _param(f"tools[{i}].parameters", exc.path)
            raise InvalidRequest(f"{where}: {exc.message}.", param=where) from None
    choice = request.tool_choice
    if isinstance(choice, dict):
        if choice.get("name") not in seen:
            raise InvalidRequest(
                f"tool_choice names '{choice.get('name')}', which is not among the tools.", param="tool_choice.name"
            )
    elif choice == "required" and not request.tools:
        raise InvalidRequest("tool_choice 'required' needs at least one tool in 'tools'.", param="tool_choice")
    json_rule = None
    if request.json_schema is not None:
        prefix = _schema_param(request)
        try:
            json_rule = SchemaCompiler(g, request.json_schema, name="json").compile()
        except SchemaError as exc:
            where = _param(prefix, exc.path)
            raise InvalidRequest(f"{where}: {exc.message}.", param=where) from None
    elif request.json_object:
        json_rule = g.primitive("object")
    check_tool_results(request)
    parallel = request.raw.get("parallel_tool_calls") if isinstance(request.raw, dict) else None
    if not isinstance(parallel, bool) or isinstance(choice, dict):
        parallel = False if isinstance(choice, dict) else None
    return OutputSpec(g, list(request.tools), choice, arg_rules, json_rule, parallel)


def check_tool_results(request: ResponseRequest) -> None:
    """Every function_call_output must answer an earlier function_call (same call_id)."""
    calls: set[str] = set()
    for item in request.items:
        if isinstance(item, FunctionCall):
            calls.add(item.call_id)
        elif isinstance(item, FunctionCallOutput) and item.call_id not in calls:
            raise InvalidRequest(
                f"function_call_output has call_id {quote(item.call_id)}, which matches no earlier function_call in "
                f"the input; send the function_call item (as received) before its output.",
                param=_input_param(request, item.call_id),
            )


def _input_param(request: ResponseRequest, call_id: str) -> str:
    raw = request.raw.get("input") if isinstance(request.raw, dict) else None
    if isinstance(raw, list):
        for i, item in enumerate(raw):
            if isinstance(item, dict) and item.get("type") == "function_call_output" and item.get("call_id") == call_id:
                return f"input[{i}].call_id"
    return "input"


# ---------------------------------------------------------------------------------------------
# Grammar assembly


def _call_object(g: Grammar, syntax: CallSyntax, spec: OutputSpec, names: list[str]) -> str:
    """`{"name": "<fn>", "<args_key>": <args>}` for each allowed function."""
    g.primitive("space")
    alts = []
    for name in names:
        alts.append(
            f'{literal(_json_str(name))} space "," space {literal(_json_str(syntax.args_key))} space ":" space '
            f"{spec.arg_rules[name]}"
        )
    choice = g.add(f"{syntax.family}-fn", " | ".join(alts))
    return g.add(f"{syntax.family}-obj", rf'"{{" space "\"name\"" space ":" space ({choice}) "}}"')


def _json_str(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def call_rules(g: Grammar, syntax: CallSyntax, spec: OutputSpec, native: bool = True) -> tuple[str, str]:
    """(calls: the whole call text with its opening marker, after: what follows the marker).

    Several calls per turn when the family does that and the client did not say no; a model
    that only knows tools from the built-in instruction gets one call unless parallel calls
    were asked for (small models otherwise repeat the same call)."""
    names = spec.allowed()
    many = syntax.parallel and (spec.parallel if spec.parallel is not None else native)
    if syntax.family == "mistral-args":
        one = g.add("m-one", " | ".join(f'{literal(n)} "[ARGS]" {spec.arg_rules[n]}' for n in names))
        after = g.add("m-after", f"{one} ({literal(syntax.open)} {one})*" if many else one)
        return g.add("m-calls", f"{literal(syntax.open)} {after}"), after
    obj = _call_object(g, syntax, spec, names)
    if syntax.family == "llama3":
        return g.add("l3-calls", f"{literal(syntax.open)}? {obj}"), obj
    if syntax.family == "mistral":
        after = g.add("m-after", f'"[" {obj} ("," space {obj})* "]"' if many else f'"[" {obj} "]"')
        return g.add("m-calls", f"{literal(syntax.open)} {after}"), after
    close = literal(syntax.close or "")
    one_after = g.add("h-after-one", f'"\\n"? {obj} "\\n"? {close}')
    call = g.add("h-call", f"{literal(syntax.open)} {one_after}")
    calls = g.add("h-calls", f'{call} ("\\n"{{0,2}} {call})*' if many else call)
    after = g.add("h-after", f'{one_after} ("\\n"{{0,2}} {call})*' if many else one_after)
    return calls, after


def think_rule(g: Grammar, think: tuple[str, str], mode: str) -> str:
    """The thinking block before a constrained answer: mode 'inside' (already opened) or 'optional'."""
    open_, close = think
    body = text_without(g, close, "think-text")
    block = f"{body} {literal(close)} [ \\n]{{0,3}}"
    if mode == "inside":
        return g.add("think", block)
    return g.add("think", f"({literal(open_)} {block})?")


# ---------------------------------------------------------------------------------------------
# The plan


@dataclass
class ChatPlan:
    prompt: str
    grammar: str | None = None
    grammar_root: str = "root"
    lazy_roots: dict[str, str] = field(default_factory=dict)  # marker -> rule, for `auto` calls
    parser_config: ParserConfig = field(default_factory=ParserConfig)
    visible_tokens: frozenset[int] = frozenset()
    dialect: Dialect | None = None
    stable: int = 0  # the prompt's first characters any conversation with its system and tools shares

    def parser(self) -> OutputParser:
        """The output parser: constrained from the start under a grammar that is on from the start;
        under a lazy grammar it is told when the grammar switches on (`OutputParser.grammar_on`)."""
        return OutputParser(self.parser_config, constrained=self.grammar is not None and not self.lazy_roots)


def build_plan(model: ChatModel, request: ResponseRequest, spec: OutputSpec, *, at_most: int | None = None) -> ChatPlan:
    """Render the conversation for `model` and assemble grammar, trigger and parser settings.

    With `at_most`, a prompt that renders longer stops there (the template's `RenderedPast`, carrying the
    prompt's start): nothing after the rendering is built for it."""
    template = model.template
    dialect = dialects.detect(template.source if template.name == "model" else None)
    syntax = dialect.syntax if spec.calls else None
    extra_system = dialects.instruction(spec.tools, spec.choice) if spec.calls and not dialect.native else None
    messages = dialects.conversation(request.items, dialect, extra_system=extra_system)
    kwargs: dict[str, Any] = {}
    if dialect.think and request.reasoning is not None and dialect.thinking_switch:
        kwargs["enable_thinking"] = bool(request.reasoning)
        kwargs["thinking"] = bool(request.reasoning)
    tools = dialects.tool_specs(spec.tools) if spec.calls and dialect.native else None
    prompt = template.render(messages, tools=tools, add_generation_prompt=True, at_most=at_most, **kwargs)

    think = dialect.think
    think_mode = "none"
    start_in_think = False
    if think:
        tail = prompt.rstrip()
        if tail.endswith(think[0]):
            if request.reasoning is False:  # the template always opens a thought: close it at once
                prompt = prompt + ("" if prompt.endswith("\n") else "\n") + think[1] + "\n\n"
            else:
                start_in_think, think_mode = True, "inside"
        elif not tail.endswith(think[1]) and request.reasoning is not False:
            think_mode = "optional"

    g = Grammar()
    g.rules = dict(spec.grammar.rules)  # plans may be built twice (a model reload); keep the spec as it was
    # The stable prefix costs two more renderings and a tokenization: found only where a checkpoint uses it.
    stable = stable_chars(template, messages, tools, prompt, **kwargs) if model.sliding_window else 0
    plan = ChatPlan(prompt=prompt, dialect=dialect, stable=stable)
    body = None
    if syntax is not None and spec.forced:
        body = call_rules(g, syntax, spec, dialect.native)[0]
    elif syntax is not None and spec.json_rule is not None:  # auto: the JSON answer, or calls
        body = f"{spec.json_rule} | {call_rules(g, syntax, spec, dialect.native)[0]}"
    elif spec.json_rule is not None:
        body = spec.json_rule
    if body is not None:
        lead = think_rule(g, think, think_mode) + " " if think and think_mode != "none" else ""
        plan.grammar_root = g.add("root", f"{lead}({body})")
        plan.grammar = g.text(plan.grammar_root)
    elif syntax is not None:
        _, after = call_rules(g, syntax, spec, dialect.native)
        plan.lazy_roots = {syntax.open: after}
        plan.grammar = g.text(after)

    plan.parser_config = ParserConfig(
        think=think,
        start_in_think=start_in_think,
        syntax=syntax,
        tool_names=frozenset(t.name for t in spec.tools),
    )
    markers = [m for m in (think or ())]
    if syntax is not None:
        markers += [syntax.open, syntax.close or "", *syntax.extra_markers]
    visible = set()
    for marker in markers:
        token = model.find_token(marker) if marker else None
        if token is not None and model.is_control(token):
            visible.add(token)
    plan.visible_tokens = frozenset(visible)
    return plan
