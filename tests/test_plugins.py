"""jaxsal.plugins: the CLI reaches the shipped agents through the `jaxsal.agents` entry point,
translates the provider's errors into its own, and says how to fix a missing provider."""
from __future__ import annotations

import importlib

import pytest

from jaxsal import plugins
from jaxsal.cli import main
from jaxsal.errors import SaliencyInputError


@pytest.fixture(autouse=True)
def fresh_provider():
    plugins.agent_provider.cache_clear()
    yield
    plugins.agent_provider.cache_clear()


def test_the_installed_provider_is_jaxsal_agents():
    provider = plugins.agent_provider()
    assert provider.module is importlib.import_module("jaxsal_agents.provider")
    assert "minatar-breakout" in provider.available()
    assert provider.card("minatar-breakout")["game"] == "minatar-breakout"
    agent = provider.load("minatar-breakout")
    assert type(agent).__module__ == "jaxsal_agents.zoo"  # the one name: no second copy as `agents`


def test_provider_errors_become_jaxsal_errors():
    provider = plugins.agent_provider()
    with pytest.raises(plugins.AgentProviderError, match="unknown agent 'nope'") as e:
        provider.load("nope")
    assert isinstance(e.value, SaliencyInputError)
    with pytest.raises(plugins.AgentProviderError, match="unknown game 'pacman'"):
        provider.check_game("pacman")


def test_no_provider_is_one_clear_error_naming_the_fix(monkeypatch, capsys):
    monkeypatch.setattr(plugins, "entry_points", lambda group: [])
    assert main(["agents"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no agents provider is installed" in err and "pip install -e ." in err


def test_a_provider_is_chosen_by_name_or_module(monkeypatch):
    monkeypatch.setenv(plugins.ENV_VAR, "jaxsal_agents.provider")
    assert plugins.agent_provider().name == "jaxsal_agents.provider"
    plugins.agent_provider.cache_clear()
    monkeypatch.setenv(plugins.ENV_VAR, "no_such_provider_module")
    with pytest.raises(plugins.AgentProviderError, match="JAXSAL_AGENT_PROVIDER=no_such_provider_module"):
        plugins.agent_provider()


def test_a_module_lacking_the_interface_is_refused():
    with pytest.raises(plugins.AgentProviderError, match="lacks .*make_env"):
        plugins.AgentProvider(importlib.import_module("jaxsal_agents.zoo"), "zoo")
