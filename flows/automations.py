"""Install the pipeline's notification automations (prefect-automations.yaml) on the Prefect
server at PREFECT_API_URL, idempotently: run it at every deploy.

    SEARCHRL_NOTIFY_URL=https://hooks.slack.com/services/... SEARCHRL_NOTIFY_CHANNEL=slack \
        python flows/automations.py [--file prefect-automations.yaml] [--dry-run]
    python flows/automations.py --block email/oncall   # any notification block already saved

The channel (`--url`/`--channel`, default $SEARCHRL_NOTIFY_URL/$SEARCHRL_NOTIFY_CHANNEL) is
saved as the notification block `searchrl-notify` (replaced when it exists), and every
send-notification action in the file without a block_document_id gets that block's. An
automation whose name exists is updated in place (duplicates left by `prefect automation
create` are deleted), so installing twice leaves one of each. Exit 0 done, 2 a bad file or
option, 7 the Prefect API unreachable.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, cast
from uuid import UUID

import httpx
import yaml
from prefect.blocks.abstract import NotificationBlock
from prefect.blocks.notifications import (
    CustomWebhookNotificationBlock,
    MicrosoftTeamsWebhook,
    SlackWebhook,
)
from prefect.client.orchestration import get_client
from prefect.events.schemas.automations import AutomationCore
from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError
from prefect.settings import PREFECT_API_URL
from pydantic import ValidationError

ROOT = Path(__file__).resolve().parents[1]
AUTOMATIONS_FILE = ROOT / "prefect-automations.yaml"
BLOCK_NAME = "searchrl-notify"
URL_ENV, CHANNEL_ENV = "SEARCHRL_NOTIFY_URL", "SEARCHRL_NOTIFY_CHANNEL"
CHANNELS = ("webhook", "slack", "teams")
USAGE, UNREACHABLE = 2, 7  # searchrl.exit_codes: configuration; a service unreachable


class AutomationsError(ValueError):
    """A bad automations file or channel; the message names the file, entry and field."""


def notification_block(channel: str, url: str) -> NotificationBlock:
    """`webhook`: a JSON POST {subject, body, source} to `url` (any receiver: a chat bridge,
    an incident tool, a script); `slack` / `teams`: the service's incoming-webhook URL."""
    if channel == "webhook":
        return CustomWebhookNotificationBlock(
            name=BLOCK_NAME, url=url,
            json_data={"subject": "{{subject}}", "body": "{{body}}", "source": "{{name}}"})
    if channel == "slack":
        return SlackWebhook(url=url)
    if channel == "teams":
        return MicrosoftTeamsWebhook(url=url)
    raise AutomationsError(f"notification channel {channel!r} is not one of {CHANNELS} "
                           f"(--channel / ${CHANNEL_ENV}); for another service save a "
                           "notification block and pass --block TYPE/NAME")


def saved_block_id(ref: str) -> UUID:
    """The id of a saved block `type-slug/name` (as `prefect block ls` lists it)."""
    slug, sep, name = ref.partition("/")
    if not sep or not slug or not name:
        raise AutomationsError(f"--block {ref!r}: expected TYPE/NAME, e.g. "
                               "slack-webhook/team-alerts (`prefect block ls`)")
    with get_client(sync_client=True) as client:
        try:
            return client.read_block_document_by_name(name, slug).id
        except ObjectNotFound:
            raise AutomationsError(f"--block {ref!r}: no such block on "
                                   f"{client.api_url}; `prefect block ls` lists them") from None


def load_automations(path: Path, block_id: UUID) -> list[AutomationCore]:
    """The file's automations, their send-notification actions pointed at `block_id`."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise AutomationsError(f"{path}: cannot read it as YAML: {exc}") from exc
    entries = data.get("automations") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise AutomationsError(f"{path}: expected a top-level `automations:` list")
    out = []
    for n, entry in enumerate(entries, start=1):
        label = f"{path}: automation {n}" + (
            f" ({entry['name']!r})" if isinstance(entry, dict) and "name" in entry else "")
        if not isinstance(entry, dict):
            raise AutomationsError(f"{label}: expected a mapping")
        actions: list[Any] = entry.get("actions") or []
        for action in actions:
            if isinstance(action, dict) and action.get("type") == "send-notification":
                action.setdefault("block_document_id", str(block_id))
        try:
            out.append(AutomationCore.model_validate(entry))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "<automation>"
            raise AutomationsError(f"{label}: field {where!r}: {first['msg']}") from exc
    names = [a.name for a in out]
    if len(set(names)) != len(names):
        raise AutomationsError(f"{path}: automation names repeat ({names}); the installer "
                               "matches them by name, so keep them unique")
    return out


def install(automations: list[AutomationCore]) -> list[tuple[str, str]]:
    """Create or update each automation by name; (name, "created" | "updated")."""
    done = []
    with get_client(sync_client=True) as client:
        for automation in automations:
            existing = client.read_automations_by_name(automation.name)
            if existing:
                client.update_automation(existing[0].id, automation)
                for extra in existing[1:]:
                    client.delete_automation(extra.id)
                done.append((automation.name, "updated"))
            else:
                client.create_automation(automation)
                done.append((automation.name, "created"))
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file", type=Path, default=AUTOMATIONS_FILE)
    parser.add_argument("--url", default=os.environ.get(URL_ENV),
                        help=f"the channel's URL (default ${URL_ENV})")
    parser.add_argument("--channel", default=os.environ.get(CHANNEL_ENV) or "webhook",
                        help=f"one of {CHANNELS} (default ${CHANNEL_ENV}, else webhook)")
    parser.add_argument("--block", help="TYPE/NAME of a saved notification block instead")
    parser.add_argument("--dry-run", action="store_true",
                        help="check the file and print the automations; change nothing")
    args = parser.parse_args(argv)
    try:
        if args.dry_run:
            for automation in load_automations(args.file, UUID(int=0)):
                print(automation.model_dump_json(indent=1))
            return 0
        if not PREFECT_API_URL.value():  # else Prefect would start a throwaway server
            raise AutomationsError("PREFECT_API_URL is not set: point it at the server the "
                                   "deployments run on")
        if args.block:
            block_id = saved_block_id(args.block)
        elif args.url:
            saved = notification_block(args.channel, args.url).save(BLOCK_NAME, overwrite=True)
            block_id = cast(UUID, saved)  # sync here: `save` is async only in a coroutine
        else:
            raise AutomationsError(f"no channel: set ${URL_ENV} (or --url), or pass --block "
                                   "TYPE/NAME of a saved notification block")
        for name, what in install(load_automations(args.file, block_id)):
            print(f"{what}: {name}")
    except AutomationsError as exc:
        print(exc, file=sys.stderr)
        return USAGE
    except (httpx.HTTPError, PrefectHTTPStatusError, RuntimeError) as exc:
        print(f"the Prefect API at {PREFECT_API_URL.value()} refused "
              f"or is unreachable ({exc}); set PREFECT_API_URL to the server the deployments "
              "run on", file=sys.stderr)
        return UNREACHABLE
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
