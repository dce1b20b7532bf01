"""What ``kdaemon offsets --reset-offsets`` says when the group has members (``reset.refusal``),
for the member mixes Kafka cannot be asked to produce on demand; the common cases run on Apache
Kafka in test_stop_and_reset_kafka.py and test_reset_offsets_kafka.py."""

from __future__ import annotations

import pytest

from kdaemon.cli.reset import Context, Expiry, ResetError, refuse_if_active, refusal
from kdaemon.client.group.describe import GroupDescription, MemberDescription


def member(instance_id: str | None, epoch: int | None = None, member_id: str = "m") -> MemberDescription:
    return MemberDescription(member_id, instance_id, "client", "127.0.0.1", (), member_epoch=epoch)


def group(protocol: str, *members: MemberDescription, state: str = "Stable") -> GroupDescription:
    return GroupDescription("g", state, "consumer", "uniform", members, protocol=protocol)


GROUP_SESSION = Context("kd", Expiry(45_000, "the group's consumer.session.timeout.ms"))


def test_an_empty_group_is_not_refused():
    refuse_if_active(group("consumer", state="Empty"), GROUP_SESSION)


def test_left_and_running_members_are_told_apart():
    """Consumer protocol: epoch -2 is kept for a restart, any other epoch is running."""
    text = refusal(group("consumer", member("kd-0", -2), member("kd-1", -2), member("other-3", 7),
                         member(None, 7, member_id="dyn")), GROUP_SESSION)
    assert text.startswith("group g is Stable with 4 member(s); offsets can only be reset while the group has none: ")
    assert ("static members kd-0, kd-1 of daemon kd (this configuration's daemon_id) stopped and are kept for a "
            "restart (member epoch -2, static members leaving temporarily): Kafka drops them within 45 s (the "
            "group's consumer.session.timeout.ms)") in text
    assert ("static member other-3 of daemon other, member dyn (client client on 127.0.0.1) are running: stop "
            "every daemon and consumer of the group") in text
    with pytest.raises(ResetError):
        refuse_if_active(group("consumer", member("kd-0", -2)), GROUP_SESSION)


def test_an_unknown_session_timeout_is_said_so():
    ctx = Context("kd", Expiry(None, "the group's consumer.session.timeout.ms, which the broker did not tell"))
    text = refusal(group("consumer", member("kd-0", -2)), ctx)
    assert ("Kafka drops it when its session times out (the group's consumer.session.timeout.ms, which the broker "
            "did not tell)") in text


def test_classic_names_the_daemon_running_here():
    ctx = Context("kd", Expiry(12_000, "[kafka] session_timeout_ms of k.toml, which its workers joined with"), 4242)
    text = refusal(group("classic", member("kd-0"), member("kd-1")), ctx)
    assert ("static members kd-0, kd-1 of daemon kd (this configuration's daemon_id); daemon kd runs here (pid "
            "4242): stop it with kdaemon stop --leave-group") in text


def test_classic_without_a_daemon_here_says_both_possibilities():
    ctx = Context("kd", Expiry(12_000, "[kafka] session_timeout_ms of k.toml, which its workers joined with"))
    text = refusal(group("classic", member("kd-0")), ctx)
    assert ("no daemon answers on this configuration's state_dir here; if that daemon is stopped, Kafka keeps its "
            "static members for a restart until their session times out, within 12 s ([kafka] session_timeout_ms "
            "of k.toml, which its workers joined with), then retry; else stop every daemon") in text


def test_classic_dynamic_members_are_running():
    text = refusal(group("classic", member(None, member_id="dyn")), GROUP_SESSION)
    assert text.endswith("member dyn (client client on 127.0.0.1): stop every daemon and consumer of the group "
                         "(kdaemon stop, systemctl stop kdaemon) and retry")
