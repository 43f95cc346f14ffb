import { Alert, Anchor, Button, Card, Group, SegmentedControl, Select, SimpleGrid, Stack, Table, Text, TextInput, Title } from "@mantine/core";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useEffect, useState, type FormEvent } from "react";
import { Link } from "react-router";

import { ApiError, api } from "../api/client";
import type { Balance, Page } from "../api/types";
import { LedgerTable, ProvisionalBadge } from "../components/Ledger";
import { ProjectPicker, useProjectChoices } from "../components/ProjectPicker";
import { ErrorAlert, QueryState } from "../components/QueryState";
import { ResponsiveTable } from "../components/ResponsiveTable";
import { formatCredits, formatDateTime, formatPercent } from "../lib/format";
import { moneyByReservation, reportRange, shownZone, type LedgerLine, type UsageReport } from "../lib/report";

type Move = "grant" | "adjust" | "refund";

const MOVES: Record<Move, { path: string; label: string; help: string }> = {
  grant: { path: "ledger/grants/", label: "Grant", help: "Credits added to the project's balance." },
  adjust: { path: "ledger/adjustments/", label: "Adjustment", help: "A correction of either sign (−5 takes 5 credits off); it cannot take the balance below zero." },
  refund: { path: "ledger/refunds/", label: "Refund", help: "Credits given back for a reservation's charge (an outage, a faulty GPU), at most what it was charged." },
};

function monthRange(): { start: string; end: string } {
  const d = new Date();
  const start = new Date(Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1));
  const end = new Date(Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1));
  return reportRange(start.toISOString().slice(0, 10), end.toISOString().slice(0, 10));
}

/** Operators: any project's balance, holds, usage and ledger, and the grants, adjustments and refunds made here. */
export function AccountingPage() {
  const { choices } = useProjectChoices();
  const [project, setProject] = useState<string | null>(null);
  useEffect(() => {
    if (!project && choices.length) setProject(choices[0].value);
  }, [project, choices]);
  const month = monthRange();
  const balance = useQuery({
    queryKey: ["balance", project],
    enabled: !!project,
    queryFn: () => api.get<Balance>(`ledger/balances/${project}/`),
  });
  const entries = useQuery({
    queryKey: ["ledger-entries", project, "all"],
    enabled: !!project,
    queryFn: () => api.get<Page<LedgerLine>>("ledger/entries/", { project: project ?? undefined, limit: 500 }),
  });
  const usage = useQuery({
    queryKey: ["usage-report", { project, ...month, group_by: "reservation" }],
    enabled: !!project,
    queryFn: () => api.get<UsageReport>("usage/report", { project: project ?? undefined, ...month, group_by: "reservation" }),
  });
  const lines = entries.data?.results ?? [];
  const money = moneyByReservation(lines);
  const holds = money.filter((m) => m.held - m.released > 0.00005);
  const refundable = money.filter((m) => m.charged - m.refunded > 0.00005);
  const zone = shownZone();

  return (
    <Stack>
      <Title order={1}>Accounting</Title>
      <Text size="sm" c="dimmed">
        Any project's balance, holds, usage and ledger. Grants, adjustments and refunds made here are ledger entries with
        you as their actor and your reason. Times are in {zone}.
      </Text>
      <ProjectPicker value={project} onChange={setProject} choices={choices} />
      {project && (
        <>
          <QueryState isLoading={balance.isLoading} error={balance.error} label="the balance">
            {balance.data && (
              <SimpleGrid cols={{ base: 2, sm: 4 }} data-testid="accounting-balance">
                <Figure label="Balance (spendable)" value={formatCredits(balance.data.balance)} testid="balance" />
                <Figure label="Held for bookings" value={formatCredits(balance.data.held)} testid="held" />
                <Figure label="Granted, all time" value={formatCredits(balance.data.by_kind.grant)} />
                <Figure label="Charged, all time" value={formatCredits(Math.abs(Number(balance.data.by_kind.charge ?? 0)))} />
              </SimpleGrid>
            )}
          </QueryState>

          <MoveForm project={project} refundable={refundable.map((m) => m.reservation)} />

          <SimpleGrid cols={{ base: 1, lg: 2 }}>
            <Card withBorder>
              <Title order={2} size="h4" mb="xs">Holds</Title>
              <Text size="xs" c="dimmed" mb="xs">Credits held for booked windows, released when each reservation ends.</Text>
              {holds.length === 0 ? (
                <Text size="sm" c="dimmed">Nothing is held.</Text>
              ) : (
                <ResponsiveTable aria-label="Holds" data-testid="accounting-holds">
                  <Table.Thead><Table.Tr><Table.Th>Reservation</Table.Th><Table.Th>Held</Table.Th></Table.Tr></Table.Thead>
                  <Table.Tbody>
                    {holds.map((m) => (
                      <Table.Tr key={m.reservation}>
                        <Table.Td data-label="Reservation"><Anchor component={Link} to={`/reservations/${m.reservation}`}>{m.reservation.slice(0, 8)}</Anchor></Table.Td>
                        <Table.Td data-label="Held">{formatCredits(m.held - m.released)}</Table.Td>
                      </Table.Tr>
                    ))}
                  </Table.Tbody>
                </ResponsiveTable>
              )}
            </Card>
            <Card withBorder>
              <Group gap="xs" mb="xs">
                <Title order={2} size="h4">Usage this month (UTC)</Title>
                {usage.data?.provisional && <ProvisionalBadge />}
              </Group>
              <QueryState isLoading={usage.isLoading} error={usage.error} isEmpty={(usage.data?.rows.length ?? 0) === 0}
                empty="No usage this month." label="usage">
                <ResponsiveTable aria-label="Usage this month" data-testid="accounting-usage">
                  <Table.Thead><Table.Tr><Table.Th>Reservation</Table.Th><Table.Th>Used GPU-h</Table.Th><Table.Th>Utilization</Table.Th><Table.Th>Credits</Table.Th></Table.Tr></Table.Thead>
                  <Table.Tbody>
                    {usage.data?.rows.map((r) => (
                      <Table.Tr key={r.key}>
                        <Table.Td data-label="Reservation"><Group gap={4}>{r.label} {r.provisional && <ProvisionalBadge />}</Group></Table.Td>
                        <Table.Td data-label="Used GPU-h">{r.used_gpu_hours.toFixed(2)}</Table.Td>
                        <Table.Td data-label="Utilization">{formatPercent(r.util_mean_percent)}</Table.Td>
                        <Table.Td data-label="Credits">{formatCredits(r.credits)}</Table.Td>
                      </Table.Tr>
                    ))}
                  </Table.Tbody>
                </ResponsiveTable>
              </QueryState>
              {usage.data && (
                <Text size="sm" mt="xs" data-testid="accounting-reclaimed">
                  Reclaimed from idle reservations this month: {(usage.data.reclaimed_gpu_hours ?? 0).toFixed(2)} GPU-h
                </Text>
              )}
            </Card>
          </SimpleGrid>

          <Card withBorder>
            <Title order={2} size="h4" mb="xs">Ledger</Title>
            <QueryState isLoading={entries.isLoading} error={entries.error} isEmpty={lines.length === 0} empty="No ledger entries." label="the ledger">
              <LedgerTable entries={lines} />
              {lines.length > 0 && <Text size="xs" c="dimmed" mt={4}>Newest first; the latest at {formatDateTime(lines[0].created_at)} {zone}.</Text>}
            </QueryState>
          </Card>
        </>
      )}
    </Stack>
  );
}

function Figure({ label, value, testid }: { label: string; value: string; testid?: string }) {
  return (
    <Card withBorder p="sm">
      <Text size="xs" c="dimmed">{label}</Text>
      <Text size="xl" fw={700} data-testid={testid}>{value}</Text>
    </Card>
  );
}

function MoveForm({ project, refundable }: { project: string; refundable: string[] }) {
  const queryClient = useQueryClient();
  const [move, setMove] = useState<Move>("grant");
  const [amount, setAmount] = useState("");
  const [reason, setReason] = useState("");
  const [reservation, setReservation] = useState<string | null>(null);
  const [done, setDone] = useState<LedgerLine | null>(null);
  const submit = useMutation({
    mutationFn: () =>
      api.post<LedgerLine>(MOVES[move].path, { project, amount: amount.trim(), reason, ...(move === "refund" ? { reservation } : {}) }),
    onSuccess: (entry) => {
      setDone(entry);
      setAmount("");
      setReason("");
      queryClient.invalidateQueries({ queryKey: ["balance", project] });
      queryClient.invalidateQueries({ queryKey: ["ledger-entries"] });
      queryClient.invalidateQueries({ queryKey: ["balances"] });
    },
  });
  const err = submit.error instanceof ApiError ? submit.error : null;
  const fieldShown = ["amount", "reason", "reservation"].some((f) => err?.fieldError(f));

  function onSubmit(e: FormEvent) {
    e.preventDefault();
    setDone(null);
    submit.mutate();
  }

  return (
    <Card withBorder component="form" onSubmit={onSubmit} aria-label="Grant, adjust or refund credits">
      <Title order={2} size="h4" mb="xs">Grant, adjust or refund</Title>
      <Stack gap="xs">
        <SegmentedControl value={move} onChange={(v) => { setMove(v as Move); submit.reset(); }} aria-label="Kind of entry"
          data={(Object.keys(MOVES) as Move[]).map((m) => ({ value: m, label: MOVES[m].label }))} />
        <Text size="xs" c="dimmed">{MOVES[move].help}</Text>
        <Group align="flex-start">
          <TextInput label="Amount (credits)" required value={amount} onChange={(e) => setAmount(e.currentTarget.value)} inputMode="decimal"
            placeholder={move === "adjust" ? "-5 or 5" : "10"} error={err?.fieldError("amount")} />
          {move === "refund" && (
            <Select label="Reservation" required data={refundable.map((r) => ({ value: r, label: r }))} value={reservation} onChange={setReservation}
              placeholder={refundable.length ? "A charged reservation" : "No charged reservation"} error={err?.fieldError("reservation")} searchable />
          )}
          <TextInput label="Reason" required value={reason} onChange={(e) => setReason(e.currentTarget.value)} style={{ flex: 1, minWidth: 220 }}
            placeholder="why: shown in the ledger" error={err?.fieldError("reason")} />
        </Group>
        <Group>
          <Button type="submit" loading={submit.isPending}>Record {MOVES[move].label.toLowerCase()}</Button>
        </Group>
        {submit.error && !fieldShown && <ErrorAlert error={submit.error} title="The ledger refused" />}
        {done && (
          <Alert color="green" title="Recorded" data-testid="move-recorded">
            A {done.kind} of {formatCredits(done.amount)} credits by {done.actor_label}: {done.reason}
          </Alert>
        )}
      </Stack>
    </Card>
  );
}
