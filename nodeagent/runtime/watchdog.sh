#!/bin/sh
# The gpucp lease watchdog: PID 1 of a replaceable container (docs/runtime.md, "Lease watchdog").
#
# Runs the image's own entrypoint and command ("$@") as its child and forwards SIGTERM, SIGUSR1 and SIGINT to
# it. Once a second it reads the lease deadline the node agent renews on every answered heartbeat (epoch
# seconds, in a read-only directory of the agent's); once that has passed, the agent is dead, frozen or cut off
# and the control plane may start this work elsewhere, so it stops the child: SIGTERM, then SIGKILL after the
# launch's stop grace. It exits with the child's exit status.
#
# POSIX sh only: it runs under the host's static busybox when the agent mounts one (GPUCP_WATCHDOG_BUSYBOX
# names it, for date and sleep), else under the image's /bin/sh and its own tools.

BB=${GPUCP_WATCHDOG_BUSYBOX:-}
LEASE=${GPUCP_LEASE_FILE:-/run/gpucp/lease/deadline}
GRACE=${GPUCP_STOP_GRACE_S:-30}

if [ "$#" -eq 0 ]; then
  echo "gpucp watchdog: no command to run (the image has neither an entrypoint nor a command)" >&2
  exit 127
fi

"$@" &
child=$!

watch() {
  while :; do
    deadline=
    read -r deadline < "$LEASE" 2>/dev/null
    now=$($BB date +%s)
    case "$deadline" in
      '' | *[!0-9]*) ;;  # no lease (yet, or a control plane that gives none): nothing to watch
      *)
        if [ "$now" -ge "$deadline" ]; then
          echo "gpucp watchdog: the node agent's lease ran out at $deadline (now $now); stopping the job" >&2
          kill -TERM "$child" 2>/dev/null
          waited=0
          while kill -0 "$child" 2>/dev/null && [ "$waited" -lt "$GRACE" ]; do
            $BB sleep 1
            waited=$((waited + 1))
          done
          kill -KILL "$child" 2>/dev/null
          exit 0
        fi
        ;;
    esac
    $BB sleep 1
  done
}

watch &
watcher=$!

trap 'kill -TERM "$child" 2>/dev/null' TERM
trap 'kill -USR1 "$child" 2>/dev/null' USR1
trap 'kill -INT "$child" 2>/dev/null' INT

while :; do
  wait "$child"
  status=$?
  # A trapped signal interrupts wait with a status above 128 while the child still runs: wait again. Once the
  # child is reaped, kill -0 fails and the status is its own.
  kill -0 "$child" 2>/dev/null || break
done
kill -TERM "$watcher" 2>/dev/null
exit "$status"
