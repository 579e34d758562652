#!/usr/bin/env bash
# How merge and catalog talk on rank 0: a live bar on a terminal (under a pty, through mpirun),
# plain progress lines in a log, JSON lines for --log-format json (errors too), nothing for
# --quiet; and --mpiio-hint parsing.
source "$(dirname "$0")/common.bash"
: "${FAULT_INJECT:?path of the LD_PRELOAD fault injector}"

# An 8 MB model; the merges that must last several progress intervals write slowly (each write
# into a staging folder, .OUT.mergepipe-staging, sleeps 5 ms).
"$MERGEPIPE" synth --preset qwen3-0.6b --layers 2 --hidden 256 --vocab 4096 --experts 3 \
  --kinds full --seed 3 --out fam >/dev/null
slowly=(env LD_PRELOAD="$FAULT_INJECT" MERGEPIPE_FAULT_SLOW_WRITE_PATH="$TEST_SCRATCH/."
        MERGEPIPE_FAULT_SLOW_MS=5 ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0")
write_config ties.yaml ties fam 3

# A log file (not a terminal): plain lines at the interval, then a final "done" line; no bar.
run_np 2 catalog --base fam/base --experts fam/expert00 fam/expert01 fam/expert02 --out cat \
  --block-bytes 64KiB --progress-interval 0.05 >catalog.out 2>catalog.err
grep -Eq "^mergepipe: catalog 100.0% .*\| done$" catalog.err || { cat catalog.err >&2; fail "no final catalog progress line"; }
"${slowly[@]}" "$MPIEXEC" -np 2 "$MERGEPIPE" merge ties.yaml --catalog cat --budget 80% \
  --out lines --threads 1 --io-threads 1 \
  --progress-interval 0.05 >lines.out 2>lines.err
grep -q $'\r' lines.err && fail "a terminal bar went to a log file"
n=$(grep -Ec "^mergepipe: merge +[0-9.]+% \| [0-9.]+ of [0-9.]+ GB \| [0-9.]+ GB/s \| ETA [0-9:-]+ \| elapsed [0-9:]+" lines.err)
((n >= 3)) || { cat lines.err >&2; fail "expected several progress lines, got $n"; }
tail -1 lines.err | grep -Eq "^mergepipe: merge 100.0% .*\| done$" || fail "the last progress line is not the final one"
grep -q "^merged 3 experts" lines.out || fail "no summary on stdout"
# The summary and the manifest say on how many nodes (issue 42: 1x2 and 2x1 looked alike).
grep -Eq "^merged 3 experts \(ties\) into lines on 2 rank\(s\) on 1 node x 1 thread\(s\)$" lines.out ||
  { cat lines.out >&2; fail "the summary does not give the nodes"; }
[[ "$(json_get lines/mergepipe.manifest.json nodes)" == 1 ]] || fail "the manifest lacks nodes: 1"
[[ "$(json_get lines/mergepipe.manifest.json node_layout.0.ranks)" == 2 ]] ||
  fail "the manifest's node_layout does not hold both ranks"
# A full-read TIES of partial fine-tunes: the scan finds expert blocks equal to the base, which
# the merge then skips; the bar still ends at 100% (it ended at 73-80%, issue 42).
"$MERGEPIPE" synth --preset qwen3-0.6b --layers 2 --hidden 256 --vocab 4096 --experts 3 \
  --kinds partial --seed 4 --out part >/dev/null
write_config part.yaml ties part 3
run_np 2 merge part.yaml --full-read --block-bytes 64KiB --out part-out --progress-interval 0.01 \
  >part.out 2>part.err
tail -1 part.err | grep -Eq "^mergepipe: merge 100.0% .*\| done$" ||
  { cat part.err >&2; fail "the full-read TIES progress did not end at 100%"; }

# A terminal: under a pty mpirun's stderr is the terminal, so rank 0 draws a bar in place.
command -v script >/dev/null || fail "script(1) is needed (util-linux)"
script -qec "$MPIEXEC -np 2 --oversubscribe $MERGEPIPE merge ties.yaml --catalog cat --budget 80% --out bar --threads 1" \
  /dev/null >bar.txt
grep -q $'\r''merge \[' bar.txt || { cat -v bar.txt >&2; fail "no progress bar on a terminal"; }
grep -Eq "merge \[#+\] 100%  [0-9.]+/[0-9.]+ GB  [0-9.]+ GB/s  ETA" bar.txt || { cat -v bar.txt >&2; fail "the bar never reached 100%"; }
same_model_files lines bar

# --quiet: nothing at all on success.
run_np 2 merge ties.yaml --catalog cat --budget 80% --out quiet --quiet >quiet.out 2>quiet.err
[[ ! -s quiet.out && ! -s quiet.err ]] || fail "--quiet printed something"

# --log-format json: every stdout line is a JSON event, ending with the result; errors are JSON
# on stderr with the exit code.
"${slowly[@]}" "$MPIEXEC" -np 2 "$MERGEPIPE" merge ties.yaml --catalog cat --budget 80% \
  --out json --log-format json \
  --progress-interval 0.05 >json.out 2>json.err
"$PYTHON" - json.out json/mergepipe.manifest.json <<'PY' || fail "bad JSON log"
import json, sys
events = [json.loads(line) for line in open(sys.argv[1])]
manifest = json.load(open(sys.argv[2]))
assert events and all(e["event"] in ("progress", "result") for e in events), events
progress = [e for e in events if e["event"] == "progress"]
assert len(progress) >= 2 and progress[-1]["state"] == "done" and progress[-1]["fraction"] == 1.0
assert all(p["done_bytes"] <= p["total_bytes"] for p in progress)
assert [p["done_bytes"] for p in progress] == sorted(p["done_bytes"] for p in progress)
result = events[-1]
assert result["event"] == "result" and result["command"] == "merge", result
assert result["plan_hash"] == manifest["plan_hash"]
assert result["bytes_read"]["expert"] == manifest["bytes_read"]["expert"]
PY
[[ ! -s json.err ]] || { cat json.err >&2; fail "--log-format json wrote to stderr on success"; }
rc=0
run_np 2 merge ties.yaml --catalog cat --budget lots --out never --log-format json >err.out 2>err.json || rc=$?
((rc == 2)) || fail "a bad budget should exit 2, got $rc"
# (mpirun adds its own lines about the non-zero exit after ours; mpirun -q drops them.)
"$PYTHON" -c "
import json, sys
e = json.loads(open('err.json').readline())
assert e['event'] == 'error' and e['code'] == 2 and 'budget' in e['message'], e
" || { cat err.json >&2; fail "the error was not one JSON line"; }
[[ ! -e never ]] || fail "a failed merge left its target"

# Option validation.
expect_exit 2 "--progress must be" run_np 1 merge ties.yaml --catalog cat --out x --progress fancy
expect_exit 2 "--log-format must be" run_np 1 merge ties.yaml --catalog cat --out x --log-format xml
expect_exit 2 "--verify-reads must be reads, first, all or off" run_np 1 merge ties.yaml --catalog cat --out x --verify-reads some
expect_exit 2 "expected key=value" run_np 1 merge ties.yaml --catalog cat --out x --mpiio-hint striping_factor
expect_exit 2 "expected key=value" run_np 1 merge ties.yaml --catalog cat --out x --mpiio-hint "a=1,b"
run_np 2 merge ties.yaml --catalog cat --budget 80% --out hinted --quiet --mpiio-hint "cb_nodes=1,romio_cb_write=automatic"
same_model_files lines hinted
echo "progress and logs: ok"
