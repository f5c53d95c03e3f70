"""Runs inside the engines venv (hack/engines.sh): asks the real vLLM 0.33 / LMCache 0.5.6 code what it makes
of what kvtier renders. Never imports kvtier.

    python engine_probe.py COMMAND < request.json > answer.json

Each command reads one JSON request on stdin and writes one JSON answer on stdout; a refusal by the
engine's own code is an answer (``{"error": ...}``), not a crash. Commands:

- ``vllm-serve``: ``{"argv": [[...], ...]}`` -> per argv (the words after ``vllm serve``), vLLM's
  own ``serve`` parser, validation and ``AsyncEngineArgs.from_cli_args``: the engine arguments.
- ``vllm-options``: ``{"dests": [...]}`` -> the option strings vLLM's ``serve`` parser registers per
  destination, and the KV connector registry's names.
- ``lmcache-config``: ``{"yaml": "..."}`` -> the file loaded as vLLM's LMCache connector loads it
  (``LMCACHE_CONFIG_FILE``, ``lmcache_get_or_create_config``): the keys LMCache took, the keys it
  ignored, the values, and whether each storage plugin's class imports.
- ``lmcache-server``: ``{"argv": [[...], ...]}`` -> per argv (the words after ``lmcache server``),
  LMCache's ``lmcache`` CLI parser and the config builders ``lmcache server`` calls.
- ``mp-connector-load``: ``{"cases": [{"prompt_tokens": P, "computed_tokens": C, "lmcache_hit_tokens":
  H}, ...], "block_size": B, "blocks_per_chunk": N}`` -> per case, what the ``LMCacheMPConnector``
  class vLLM's connector registry loads answers the scheduler (``get_num_new_matched_tokens``) for a
  prompt of P tokens, C of them in vLLM's own prefix cache, when the LMCache server's lookup found
  H: ``{"tokens_to_load": ..., "load_async": ...}``. Its scheduler-side state is a stand-in (no
  server runs); the answer is the package's code.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import inspect
import io
import json
import logging
import os
import sys
import tempfile
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("LMCACHE_DISABLE_BANNER", "1")


def plain(value: Any, depth: int = 8) -> Any:
    """A JSON-able copy of an engine value (dataclasses, pydantic models and plain objects as dicts)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth == 0:
        return repr(value)
    if isinstance(value, dict):
        return {str(key): plain(item, depth - 1) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(item, depth - 1) for item in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: plain(getattr(value, field.name), depth - 1) for field in dataclasses.fields(value)}
    if hasattr(value, "model_dump"):
        return plain(value.model_dump(), depth - 1)
    if hasattr(value, "__dict__") and not callable(value):
        fields = {key: plain(item, depth - 1) for key, item in vars(value).items() if not key.startswith("__")}
        return {"__type__": type(value).__name__, **fields}
    return repr(value)


@contextlib.contextmanager
def captured_stderr():
    """argparse reports a refusal on stderr, then exits: keep both as the answer."""
    buffer = io.StringIO()
    with contextlib.redirect_stderr(buffer):
        yield buffer


def refusal(buffer: io.StringIO, error: BaseException) -> str:
    text = buffer.getvalue().strip().splitlines()
    return (text[-1] if text else "") or f"{type(error).__name__}: {error}"


# --- vLLM -----------------------------------------------------------------------------------------------


def _serve_parser():
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    command = ServeSubcommand()
    serve = command.subparser_init(subparsers)
    return parser, serve, command


def vllm_serve(request: dict[str, Any]) -> list[dict[str, Any]]:
    from vllm.engine.arg_utils import AsyncEngineArgs

    answers = []
    for argv in request["argv"]:
        parser, _, command = _serve_parser()
        with captured_stderr() as buffer:
            try:
                args = parser.parse_args(["serve", *argv])
                command.validate(args)
            except (SystemExit, Exception) as error:
                answers.append({"error": refusal(buffer, error)})
                continue
        if getattr(args, "model_tag", None) is not None:  # what `vllm serve` does with its positional model
            args.model = args.model_tag
        engine = AsyncEngineArgs.from_cli_args(args)
        fields = {field.name: plain(getattr(engine, field.name)) for field in dataclasses.fields(engine)}
        answers.append({"engine": fields, "port": args.port, "host": args.host})
    return answers


def vllm_options(request: dict[str, Any]) -> dict[str, Any]:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    _, serve, _ = _serve_parser()
    options: dict[str, list[str]] = {}
    every: dict[str, str] = {}
    for action in serve._actions:
        if action.dest in request["dests"]:
            options.setdefault(action.dest, []).extend(action.option_strings)
        every.update(dict.fromkeys(action.option_strings, action.dest))
    return {
        "options": options,
        "every": every,
        "connectors": sorted(KVConnectorFactory._registry),
        "allow_abbrev": serve.allow_abbrev,
    }


# --- LMCache --------------------------------------------------------------------------------------------


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def lmcache_config(request: dict[str, Any]) -> dict[str, Any]:
    """The config file as vLLM's LMCache connector loads it: `LMCACHE_CONFIG_FILE`, then LMCache's own loader."""
    import yaml
    from lmcache.integration.vllm.utils import lmcache_get_or_create_config

    warnings = _Warnings()
    logging.getLogger("lmcache").addHandler(warnings)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as file:
        file.write(request["yaml"])
    os.environ["LMCACHE_CONFIG_FILE"] = file.name
    try:
        config = lmcache_get_or_create_config()
    finally:
        os.unlink(file.name)
    given = yaml.safe_load(request["yaml"]) or {}
    taken = sorted(getattr(config, "_user_set_keys", set()))
    answer: dict[str, Any] = {
        "taken": taken,
        "ignored": sorted(set(given) - set(taken)),
        "values": {key: plain(getattr(config, key)) for key in taken},
        "warnings": warnings.messages,
        "plugins": {},
    }
    extra = config.extra_config or {}
    for name in config.storage_plugins or []:
        module_path = extra.get(f"storage_plugin.{name}.module_path")
        class_name = extra.get(f"storage_plugin.{name}.class_name")
        plugin: dict[str, Any] = {"module_path": module_path, "class_name": class_name}
        try:
            module = importlib.import_module(module_path)
            plugin["class_found"] = inspect.isclass(getattr(module, class_name, None))
        except Exception as error:
            plugin["error"] = f"{type(error).__name__}: {error}"
        answer["plugins"][name] = plugin
    return answer


def _lmcache_server_parser(argv: list[str]) -> argparse.ArgumentParser:
    from lmcache.cli.commands import register_commands

    # `lmcache server` registers its flags only when its server modules import: make that loud.
    importlib.import_module("lmcache.v1.multiprocess.http_server")
    parser = argparse.ArgumentParser(prog="lmcache")
    subparsers = parser.add_subparsers(dest="command")
    register_commands(subparsers, ["server", *argv])
    return parser


def lmcache_server(request: dict[str, Any]) -> list[dict[str, Any]]:
    from lmcache.v1.distributed.config import parse_args_to_config
    from lmcache.v1.mp_observability.config import parse_args_to_observability_config
    from lmcache.v1.multiprocess.config import (
        parse_args_to_http_frontend_config,
        parse_args_to_mp_server_config,
    )

    answers = []
    for argv in request["argv"]:
        parser = _lmcache_server_parser(argv)
        with captured_stderr() as buffer:
            try:
                args = parser.parse_args(["server", *argv])
                configs = {
                    "http": parse_args_to_http_frontend_config(args),
                    "mp": parse_args_to_mp_server_config(args),
                    "storage": parse_args_to_config(args),
                    "observability": parse_args_to_observability_config(args),
                }
            except (SystemExit, Exception) as error:
                answers.append({"error": refusal(buffer, error)})
                continue
        answers.append({"args": plain(vars(args)), **{name: plain(config) for name, config in configs.items()}})
    return answers


def mp_connector_load(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [_mp_connector_load(case, request["block_size"], request["blocks_per_chunk"]) for case in request["cases"]]


def _mp_connector_load(case: dict[str, Any], block_size: int, blocks_per_chunk: int) -> dict[str, Any]:
    from types import SimpleNamespace

    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.v1.request import RequestStatus

    # vLLM's registry entry prefers the class the lmcache package ships (LMCache 0.5.6's).
    connector = KVConnectorFactory._registry["LMCacheMPConnector"]()
    states = importlib.import_module(connector.__module__).LMCacheMPRequestState
    tokens = list(range(case["prompt_tokens"]))
    tracker = SimpleNamespace(
        state=states.PREFETCHING,  # a request the scheduler asks about for the first time
        num_lmcache_hit_tokens=0,
        num_stored_tokens=0,
        num_vllm_hit_tokens=0,
        lookup_started_at=None,
        allocated_block_ids=[],
        cache_salt=None,
        request_configs=None,
        get_token_ids=lambda: tokens,
    )
    stand_in = SimpleNamespace(
        _get_or_create_request_tracker=lambda req: tracker,
        _reserve_last_token_for_lookup=False,
        _hit_alignment_tokens=block_size,
        _connector_stats=SimpleNamespace(record_lookup=lambda seconds: None),
        scheduler_adapter=SimpleNamespace(
            maybe_submit_lookup_request=lambda *args, **kwargs: None,
            check_lookup_result=lambda request_id: case["lmcache_hit_tokens"],
            lmcache_tokens_per_chunk=block_size * blocks_per_chunk,
        ),
    )
    prompt = SimpleNamespace(
        request_id="r",
        status=RequestStatus.WAITING,
        all_token_ids=tokens,
        num_computed_tokens=case["computed_tokens"],
    )
    to_load, load_async = connector.get_num_new_matched_tokens(stand_in, prompt, case["computed_tokens"])
    return {
        "connector": f"{connector.__module__}.{connector.__qualname__}",
        "tokens_to_load": to_load,
        "load_async": load_async,
    }


COMMANDS = {
    "vllm-serve": vllm_serve,
    "vllm-options": vllm_options,
    "lmcache-config": lmcache_config,
    "lmcache-server": lmcache_server,
    "mp-connector-load": mp_connector_load,
}


def main() -> None:
    request = json.load(sys.stdin)
    answer = COMMANDS[sys.argv[1]](request)
    sys.stdout.flush()
    print("\n@@ANSWER@@" + json.dumps(answer))


if __name__ == "__main__":
    main()
