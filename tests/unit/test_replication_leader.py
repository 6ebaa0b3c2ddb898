"""The leader machine: ISR change requests conditional on both epochs, and their outcomes."""

import pytest

from bascule.partition.log.epochs import EpochHistory
from bascule.partition.replication.leader import IsrOutcome, IsrRequest, Leadership


def leadership(isr=("L", "F"), leo=10, hw=4, partition_epoch=3) -> Leadership:
    return Leadership(
        "L", 7, partition_epoch, ("L", "F", "G"), isr, history=EpochHistory([(1, 0)]),
        log_end_offset=leo, hw=hw, min_isr=1, max_lag_time=15.0, leader_timeout=15.0, now=0.0,
    )


def test_a_new_leadership_records_its_epoch_before_its_first_append():
    history = EpochHistory([(1, 0)])
    Leadership("L", 7, 0, ("L",), ("L",), history=history, log_end_offset=10, hw=9, min_isr=1,
               max_lag_time=15.0, leader_timeout=15.0, now=0.0)
    assert history.entries == [(1, 0), (7, 10)]


def test_requests_carry_both_epochs_and_are_not_repeated_while_in_flight():
    lead = leadership()
    lead.tracker.record_fetch("F", 10, 7, 1.0)
    lead.tracker.record_fetch("G", 10, 7, 1.0)
    requests = lead.isr_requests(1.0)
    assert requests == [IsrRequest("G", True, leader_epoch=7, partition_epoch=3)]
    assert lead.isr_requests(2.0) == []


def test_an_expansion_with_an_unknown_outcome_keeps_holding_the_hw_and_is_asked_again():
    lead = leadership()
    lead.tracker.record_fetch("F", 10, 7, 1.0)
    lead.tracker.record_fetch("G", 10, 7, 1.0)
    [request] = lead.isr_requests(1.0)
    lead.tracker.leader_appended(14)
    lead.tracker.record_fetch("F", 14, 7, 2.0)
    lead.isr_request_done(request, IsrOutcome.UNKNOWN)
    assert lead.tracker.hw == 9  # G may be in the ISR: the HW does not pass its log end
    assert lead.isr_requests(3.0) == [request]
    lead.isr_request_done(request, IsrOutcome.REFUSED)
    assert lead.tracker.hw == 13


def test_metadata_at_a_newer_partition_epoch_settles_an_unknown_expansion():
    lead = leadership()
    lead.tracker.record_fetch("G", 10, 7, 1.0)
    lead.tracker.record_fetch("F", 10, 7, 1.0)
    [request] = lead.isr_requests(1.0)
    lead.isr_request_done(request, IsrOutcome.UNKNOWN)
    lead.metadata_changed({"L", "F", "G"}, 4, min_isr=1, now=2.0)  # it did commit
    assert lead.tracker.isr == {"L", "F", "G"} and lead.tracker.pending_expansions == frozenset()
    assert lead.isr_requests(3.0) == []


def test_an_older_metadata_view_is_ignored():
    lead = leadership(partition_epoch=5)
    lead.metadata_changed({"L"}, 4, min_isr=1, now=1.0)
    assert lead.tracker.isr == {"L", "F"}


@pytest.mark.parametrize("epoch,fenced", [(6, False), (7, False), (8, True)])
def test_a_newer_epoch_in_a_request_fences_the_leadership(epoch, fenced):
    assert leadership().fenced_by(epoch) is fenced
