#!/usr/bin/env bash
# The interactive chat of `edgellm run` reuses its KV across turns: drive it in tmux with a ~1,500-token
# system prompt and three questions, and print each turn's `--verbose` prompt line (how many prompt
# tokens came from the prefix cache, and the time to the first token).
#     bash scripts/chat_turns_tmux.sh [MODEL] [BACKEND]
set -euo pipefail
model=${1:-smollm2-135m}
backend=${2:-native}
root=$(cd "$(dirname "$0")/.." && pwd)
system=$(head -c 6000 "$root/tests/fixtures/text/licenses.txt" | tr '\n"' '  ')
session=edgellm-chat-$$
tmux new-session -d -s "$session" -x 200 -y 50 \
    "edgellm run $model --backend $backend --verbose -n 24 --temp 0 -s \"$system\"; sleep 30"
trap 'tmux kill-session -t "$session" 2>/dev/null || true' EXIT
wait_for() {  # until the pane shows $1 prompt-eval lines (each turn prints one), at most 180 s
    for _ in $(seq 1 360); do
        n=$(tmux capture-pane -p -S -2000 -t "$session" | grep -c "^generation:" || true)
        [ "$n" -ge "$1" ] && return 0
        sleep 0.5
    done
    echo "timed out waiting for turn $1" >&2
    tmux capture-pane -p -t "$session" >&2
    return 1
}
sleep 3
turn=0
for q in "What is this text about?" "Who publishes it?" "Name one freedom it grants."; do
    turn=$((turn + 1))
    tmux send-keys -t "$session" "$q" Enter
    wait_for "$turn"
done
tmux send-keys -t "$session" "/bye" Enter
tmux capture-pane -p -S -2000 -t "$session" | grep "^prompt eval:"
