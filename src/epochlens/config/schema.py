"""Schema validation of a configuration, with the schema's defaults filled in (torch-free).

:func:`validate` does what ``snakemake.utils.validate(config, schema)`` does (JSON Schema draft
2020-12, defaults of ``properties`` filled in place), so that the workflow and the unit tests see
the same configuration, and explains every violation by its key (:func:`explain_config_errors`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import jsonschema
import yaml
from jsonschema import validators

from epochlens.errors import ConfigError


@cache
def _load(path: str) -> dict:
    # libyaml's loader where PyYAML has it: the schema is read by every dry run, 7x faster.
    return yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_schema(path: str | Path) -> dict:
    """The schema at ``path`` (YAML or JSON), read once per process."""
    return copy.deepcopy(_load(str(Path(path).resolve())))


def _with_defaults(validator_class: type) -> type:
    """A validator class that fills the defaults of ``properties`` before checking them (the
    recipe of the jsonschema FAQ, as Snakemake uses it); defaults are copied, never shared."""
    check_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties: dict, instance, schema: dict) -> Iterator:
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from check_properties(validator, properties, instance, schema)

    return validators.extend(validator_class, {"properties": set_defaults})


_DefaultValidator = _with_defaults(jsonschema.Draft202012Validator)


def explain_config_errors(config: dict, schema_path: str | Path) -> str:
    """One line per schema violation: where in the config, what is wrong, what is allowed."""
    validator = jsonschema.Draft202012Validator(load_schema(schema_path))
    lines = []
    for err in sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        hint = ""
        if err.validator == "additionalProperties" and isinstance(err.schema, dict):
            allowed = sorted(err.schema.get("properties", {}))
            hint = f"; allowed keys here: {', '.join(allowed)}" if allowed else ""
        elif err.validator == "enum":
            hint = f"; allowed values: {', '.join(map(str, err.validator_value))}"
        lines.append(f"  - {where}: {err.message}{hint}")
    if not lines:
        return ""
    return (
        f"invalid configuration ({len(lines)} problem(s)); fix these keys in your config file "
        f"(documented in {schema_path}):\n" + "\n".join(lines)
    )


def fill_defaults(config: dict, schema_path: str | Path) -> dict:
    """Check ``config`` against the schema and fill in its defaults, in place.

    Raises:
        ConfigError: every violation, one line per key (:func:`explain_config_errors`).
    """
    try:
        _DefaultValidator(load_schema(schema_path)).validate(config)
    except jsonschema.ValidationError:
        raise ConfigError(explain_config_errors(config, schema_path)) from None
    return config
