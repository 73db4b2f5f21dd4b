"""The rank-aware logger (ddp_lab.instruments.logs): rank 0 on the console, all ranks on request with a rank prefix, every rank in
its own record (the rank's stderr under the launcher, a file with log_dir), read back from the
RunResult. Distributed tests are a public test plus a per-rank function."""
from __future__ import annotations

import logging

import pytest

import ddp_lab
from ddp_lab.instruments import logs


def _log_some() -> dict:
    log = logs.get_logger("t.ranklog")
    log.info("hello from %s", "training")
    log.info("shard rows: %d", 10 + ddp_lab.rank_info().rank, all_ranks=True)
    log.debug("only in the record")
    log.warning("two\nlines")
    try:
        {}["missing"]
    except KeyError:
        log.exception("lookup failed")
    logging.getLogger("t.ranklog").info("through the plain logging API")
    return {"rank": ddp_lab.rank_info().rank}


@pytest.fixture(scope="module")
def run():
    result = ddp_lab.launch(_log_some, world_size=2, timeout=60)
    result.raise_for_status()
    return result


def test_only_rank0_speaks_on_the_console_unless_asked(run):
    assert run.ranks[0].stdout.splitlines()[:2] == ["hello from training", "[rank 0] shard rows: 10"]
    assert run.ranks[1].stdout.splitlines() == ["[rank 1] shard rows: 11"]
    assert "only in the record" not in logs.console(run)


def test_every_rank_keeps_every_message_in_its_record(run):
    for rank in (0, 1):
        messages = [r.message for r in logs.records(run, rank=rank)]
        assert messages[:4] == ["hello from training", f"shard rows: {10 + rank}",
                                "only in the record", "two\nlines"]
        assert messages[4].startswith("lookup failed\nTraceback") and "KeyError: 'missing'" in messages[4]
        assert messages[5] == "through the plain logging API"
        assert {r.rank for r in logs.records(run, rank=rank)} == {rank}


def test_records_are_filtered_by_level_and_logger(run):
    assert [r.level for r in logs.records(run, rank=1, level="WARNING")] == ["WARNING", "ERROR"]
    assert logs.records(run, logger="someone.else") == []
    assert len(logs.records(run.ranks[0])) == 6  # a RankResult works too


def test_console_leaves_records_out(run):
    text = logs.console(run)
    assert "hello from training" in text and "[rank 1] shard rows: 11" in text
    assert not any(line.startswith("[rank 0] ") and " INFO " in line for line in text.splitlines())


def test_log_dir_writes_one_file_per_rank_that_parse_reads(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DDP_LAB_RANK_PROCESS", raising=False)
    monkeypatch.setenv("RANK", "3")
    log = logs.get_logger("t.file", log_dir=str(tmp_path), console_level="WARNING")
    log.info("quiet on the console")
    log.error("loud")
    assert capsys.readouterr().out == ""  # rank 3, not asked to speak
    log.error("every rank", all_ranks=True)
    assert capsys.readouterr().out == "[rank 3] every rank\n"
    recs = logs.parse((tmp_path / "rank3.log").read_text())
    assert [(r.rank, r.level, r.logger, r.message) for r in recs] == [
        (3, "INFO", "t.file", "quiet on the console"), (3, "ERROR", "t.file", "loud"),
        (3, "ERROR", "t.file", "every rank")]


def test_asking_again_does_not_duplicate_handlers(capsys, monkeypatch):
    monkeypatch.delenv("DDP_LAB_RANK_PROCESS", raising=False)
    monkeypatch.setenv("RANK", "0")
    logs.get_logger("t.again")
    log = logs.get_logger("t.again")
    log.info("once")
    assert capsys.readouterr().out == "once\n"
    assert len(logging.getLogger("t.again").handlers) == 1  # console only: no record outside a launch


def test_unknown_level_is_refused():
    with pytest.raises(ValueError, match="unknown logging level 'LOUD'"):
        logs.get_logger("t.bad", console_level="LOUD")


def test_parse_skips_foreign_lines_and_joins_continuations():
    text = ("W1202 12:00:00.000 torch warning\n"
            "[rank 2] 12:00:01.250 INFO train: step 1\n"
            "[rank 2]     more of step 1\n"
            "[rank 2] something that is not a record\n")
    assert logs.parse(text) == [logs.Record(2, "12:00:01.250", "INFO", "train", "step 1\nmore of step 1")]
