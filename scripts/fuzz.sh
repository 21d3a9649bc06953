#!/usr/bin/env bash
# Fuzz the loaders: `bash scripts/fuzz.sh [SECONDS] [TARGET...]` runs each cargo-fuzz target in fuzz/
# (all of them by default) for SECONDS (default 60) and prints executions and crashes per target.
# Exit status 1 if any target crashed. See docs/fuzzing.md.
#
# - cargo-fuzz and libFuzzer need nightly flags; on a stable toolchain RUSTC_BOOTSTRAP=1 allows them
#   (set here). cargo-fuzz is installed with `cargo install cargo-fuzz --locked` when missing.
# - Inputs: fuzz/seeds/<target> (committed, read-only) and fuzz/corpus/<target> (what the fuzzer
#   finds; not committed). Crashes land in fuzz/artifacts/<target>/; copy each one into
#   fuzz/regressions/<target>/ (replayed by `cargo test -p domino-models --test fuzz_regressions`)
#   once the bug is fixed.
# - FUZZ_SANITIZER (default none: the loaders are safe Rust, so overflow checks and panics are the
#   signal, and builds and runs are several times faster than with address), FUZZ_JOBS (default 1
#   process per target), FUZZ_SUMMARY (a file to write the Markdown table to).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root/fuzz"

seconds="${1:-60}"
shift || true
all_targets=(gguf safetensors shard_index target_config drafter_config gguf_tokenizer chat_template lookup_table)
targets=("${@:-${all_targets[@]}}")
sanitizer="${FUZZ_SANITIZER:-none}"
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz (cargo install cargo-fuzz --locked)"
    cargo install cargo-fuzz --locked
fi

echo "== build (cargo fuzz build -s $sanitizer)"
start=$SECONDS
cargo fuzz build -s "$sanitizer" 2>&1 | tail -n 3
echo "   built in $(( SECONDS - start )) s"

summary="| target | seconds | executions | exec/s | crashes |"$'\n'"|---|---:|---:|---:|---:|"
total=0
failed=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    before=$(find "artifacts/$t" -type f | wc -l)
    log="artifacts/$t.log"
    echo "== $t: ${seconds}s"
    set +e
    cargo fuzz run -s "$sanitizer" "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
        -jobs="${FUZZ_JOBS:-1}" -workers="${FUZZ_JOBS:-1}" \
        -artifact_prefix="artifacts/$t/" >"$log" 2>&1
    rc=$?
    set -e
    # With -jobs, libFuzzer writes one fuzz-N.log per job; count every job's executions.
    execs=$(cat "$log" fuzz-*.log 2>/dev/null | sed -n 's/^stat::number_of_executed_units: *//p' | awk '{s += $1} END {print s + 0}')
    rm -f fuzz-*.log
    crashes=$(( $(find "artifacts/$t" -type f | wc -l) - before ))
    if [[ $rc -ne 0 && $crashes -eq 0 ]]; then
        crashes=1 # a failure without an artifact (build error, out of memory in the harness)
    fi
    if [[ $crashes -ne 0 ]]; then
        failed=1
        echo "   FAILED (exit $rc): see fuzz/$log and fuzz/artifacts/$t/"
        grep -m 5 -E "panicked|ERROR|SUMMARY" "$log" | sed 's/^/   /' || true
    fi
    total=$(( total + execs ))
    echo "   $execs executions, $crashes crash(es)"
    summary+=$'\n'"| $t | $seconds | $execs | $(( execs / (seconds > 0 ? seconds : 1) )) | $crashes |"
done
summary+=$'\n'"| all | $(( seconds * ${#targets[@]} )) | $total | | |"
echo
echo "$summary"
if [[ -n "${FUZZ_SUMMARY:-}" ]]; then
    echo "$summary" >"$FUZZ_SUMMARY"
fi
exit $failed
