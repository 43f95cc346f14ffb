import { Anchor, Badge, Table } from "@mantine/core";
import { Link } from "react-router";

import { ResponsiveTable } from "./ResponsiveTable";

import { formatCredits, formatDateTime } from "../lib/format";
import { shownZone, type LedgerLine } from "../lib/report";

/** Marks a figure that is still settling (see docs/accounting.md, "Provisional figures"). */
export function ProvisionalBadge() {
  return (
    <Badge color="yellow.3" c="dark.9" variant="filled" size="sm" data-testid="provisional">
      provisional
    </Badge>
  );
}

/** A project's ledger entries, newest first, with the zone of their times named. */
export function LedgerTable({ entries }: { entries: LedgerLine[] }) {
  const when = `When (${shownZone()})`;
  return (
    <ResponsiveTable minWidth={600} striped aria-label="Ledger entries" data-testid="ledger-entries">
      <Table.Thead>
        <Table.Tr>
          <Table.Th>{when}</Table.Th><Table.Th>Kind</Table.Th><Table.Th>Credits</Table.Th>
          <Table.Th>Reservation</Table.Th><Table.Th>By</Table.Th><Table.Th>Reason</Table.Th>
        </Table.Tr>
      </Table.Thead>
      <Table.Tbody>
        {entries.map((e) => (
          <Table.Tr key={e.id}>
            <Table.Td data-label={when}>{formatDateTime(e.created_at)}</Table.Td>
            <Table.Td data-label="Kind">{e.kind}</Table.Td>
            <Table.Td data-label="Credits">{formatCredits(e.amount)}</Table.Td>
            <Table.Td data-label="Reservation">{e.reservation ? <Anchor component={Link} to={`/reservations/${e.reservation}`}>{e.reservation.slice(0, 8)}</Anchor> : "–"}</Table.Td>
            <Table.Td data-label="By">{e.actor_label}</Table.Td>
            <Table.Td data-label="Reason">{e.reason}</Table.Td>
          </Table.Tr>
        ))}
      </Table.Tbody>
    </ResponsiveTable>
  );
}

