import { Alert, Anchor, Button, Card, Checkbox, List, NumberInput, Radio, Select, Stack, Table, Text, TextInput, Title, VisuallyHidden } from "@mantine/core";
import { useMutation, useQueryClient } from "@tanstack/react-query";
import { useEffect, useState, type FormEvent } from "react";
import { Link } from "react-router";

import { ApiError, api } from "../api/client";
import { useGpuModels, useMe, usePriorityClasses, useQueuedRequests, useRequestDetails } from "../api/hooks";
import type { QueuedRequest, QueuedRequestDetail } from "../api/types";
import { StateBadge } from "../components/Badges";
import { ClassBadge } from "../components/ClassBadge";
import { ContainerFields, SecretFields, SpecFields } from "../components/BookingFields";
import { ConfirmButton } from "../components/ConfirmButton";
import { DateTimeInput } from "../components/DateTimeInput";
import { QueryState } from "../components/QueryState";
import { ResponsiveTable } from "../components/ResponsiveTable";
import { useShownZone } from "../components/ZoneToggle";
import { formatDateTime, formatRelative, shortUuid } from "../lib/format";
import { cancellable, CLASS_NOT_ALLOWED, classDescription, classInfo, classLabel, reasonText, durationText, specText, standing, submitBody, submitProblems, type SpecChoice } from "../lib/queue";
import type { SecretChoice } from "../lib/secrets";

const POLL_MS = 10_000;

/** The caller's projects' queued requests, and a form to queue one: it starts when its GPUs are free. */
export function QueuePage() {
  return (
    <Stack>
      <Title order={1} size="h2">
        Queue
      </Title>
      <Text size="sm" c="dimmed">
        A queued request books itself as soon as GPUs for it are free: nothing is booked and no credits are held
        while it waits. Its estimated start counts the booked windows; the queue ahead may move it later.
      </Text>
      {/* The list takes the page's width (it has many columns); the form sits under it, at a form's width. */}
      <RequestsCard />
      <SubmitCard />
    </Stack>
  );
}

function RequestsCard() {
  const requests = useQueuedRequests({}, POLL_MS);
  const rows = [...(requests.data ?? [])].sort(
    (a, b) => Number(cancellable(b)) - Number(cancellable(a)) || b.created_at.localeCompare(a.created_at),
  );
  const waiting = rows.filter(cancellable).map((r) => r.id);
  const details = useRequestDetails(waiting, POLL_MS);
  const detailOf = new Map<string, QueuedRequestDetail>();
  for (const d of details) if (d.data) detailOf.set(d.data.id, d.data);

  return (
    <Card withBorder>
      <Text fw={600} mb="xs">Your projects' requests</Text>
      <QueryState
        isLoading={requests.isLoading}
        error={requests.error}
        isEmpty={rows.length === 0}
        empty="No requests yet. Queue one with the form."
        label="the queue"
      >
        <ResponsiveTable minWidth={900} striped data-testid="queue-table">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Name</Table.Th>
              <Table.Th>Class</Table.Th>
              <Table.Th style={{ minWidth: 110 }}>State</Table.Th>
              <Table.Th>Position</Table.Th>
              <Table.Th>Estimated start</Table.Th>
              <Table.Th>Reason</Table.Th>
              <Table.Th>Reservation</Table.Th>
              <Table.Th>
                <VisuallyHidden>Actions</VisuallyHidden>
              </Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {rows.map((r) => (
              <RequestRow key={r.id} r={r} detail={detailOf.get(r.id)} />
            ))}
          </Table.Tbody>
        </ResponsiveTable>
      </QueryState>
    </Card>
  );
}

function RequestRow({ r, detail }: { r: QueuedRequest; detail?: QueuedRequestDetail }) {
  const queryClient = useQueryClient();
  const cancel = useMutation({
    mutationFn: () => api.post<QueuedRequestDetail>(`requests/${r.id}/cancel/`, { reason: "cancelled in the portal" }),
    onSuccess: () => queryClient.invalidateQueries({ queryKey: ["requests"] }),
  });
  const zone = useShownZone();
  const waiting = cancellable(r);
  const est = detail?.estimated_start;
  return (
    <Table.Tr id={`request-${r.id}`} data-testid={`request-${r.name}`}>
      <Table.Td data-label="Name">
        <Text size="sm" fw={500}>{r.name}</Text>
        <Text size="xs" c="dimmed">
          {r.project} · {specText(r.spec)} · {durationText(r)}
        </Text>
        {r.requeued_from && (
          <Text size="xs">
            Queued again from{" "}
            <Anchor href={`#request-${r.requeued_from}`} data-testid="requeued-from">
              request {shortUuid(r.requeued_from)}
            </Anchor>
          </Text>
        )}
      </Table.Td>
      <Table.Td data-label="Class">
        <ClassBadge name={r.priority_class} />
        {r.requeue && <Text size="xs">requeues if preempted</Text>}
      </Table.Td>
      <Table.Td data-label="State">
        <StateBadge state={r.state} />
      </Table.Td>
      <Table.Td data-label="Position" data-testid="request-position">
        {waiting ? (detail ? standing(detail) : "…") : "–"}
      </Table.Td>
      <Table.Td data-label="Estimated start" data-testid="request-estimate">
        {!waiting ? (r.started_at ? `started ${formatDateTime(r.started_at)}` : "–") : !detail ? "…" : est ? (
          <>
            {formatDateTime(est)}
            <Text size="xs" c="dimmed">{formatRelative(est)}</Text>
          </>
        ) : (
          "none free in the week ahead"
        )}
        {r.start_by && waiting && <Text size="xs">must start by {formatDateTime(r.start_by)}</Text>}
      </Table.Td>
      <Table.Td data-label="Reason" data-testid="request-reason">
        <Text size="sm">{r.reason ? reasonText(r.reason, zone) : "–"}</Text>
      </Table.Td>
      <Table.Td data-label="Reservation">
        {r.reservation ? (
          <Anchor component={Link} to={`/reservations/${r.reservation}`} data-testid="request-reservation">
            {shortUuid(r.reservation)}
          </Anchor>
        ) : (
          "–"
        )}
      </Table.Td>
      <Table.Td>
        {waiting && (
          <ConfirmButton
            aria-label={`Cancel request ${r.name}`}
            title="Cancel this request?"
            message={<>It leaves the queue and will not start. Nothing was booked or charged for it.</>}
            confirmLabel="Cancel the request"
            keepLabel="Keep it queued"
            errorTitle="Could not cancel"
            onConfirm={() => cancel.mutateAsync()}
            size="xs"
          >
            Cancel
          </ConfirmButton>
        )}
      </Table.Td>
    </Table.Tr>
  );
}

function SubmitCard() {
  const me = useMe().data!;
  const models = useGpuModels();
  const classes = usePriorityClasses();
  const queryClient = useQueryClient();
  const bookable = me.memberships.filter((m) => m.role !== "viewer");
  const [project, setProject] = useState<string | null>(bookable[0]?.project_slug ?? null);
  const [name, setName] = useState("queued run");
  const [spec, setSpec] = useState<SpecChoice>({ by: "model", model: null, minMemoryGib: 40, size: "gpus", count: 1 });
  useEffect(() => {
    if (!spec.model && models.data?.length) setSpec((s) => ({ ...s, model: models.data![0].name }));
  }, [spec.model, models.data]);
  const [hours, setHours] = useState<number>(1);
  const [startBy, setStartBy] = useState<number | null>(null);
  const [priorityClass, setPriorityClass] = useState("normal");
  const [requeue, setRequeue] = useState(false);
  // The demo fleet's local image; no registry is assumed.
  const [image, setImage] = useState("gpucp-busybox:test");
  const [command, setCommand] = useState("");
  const [secrets, setSecrets] = useState<SecretChoice[]>([]);

  const form = { project, name, spec, durationHours: hours, startBy, priorityClass, requeue, image, command, secrets };
  const problems = submitProblems(form);
  const submit = useMutation({
    mutationFn: () => api.post<QueuedRequestDetail>("requests/", submitBody(form, classes.data)),
    onSuccess: () => queryClient.invalidateQueries({ queryKey: ["requests"] }),
  });
  const err = submit.error instanceof ApiError ? submit.error : null;
  const fieldErr = (...names: string[]) => names.map((n) => err?.fieldError(n)).find(Boolean);
  const chosen = classInfo(classes.data, priorityClass);

  function onSubmit(e: FormEvent) {
    e.preventDefault();
    if (problems.length === 0) submit.mutate();
  }

  return (
    <Card withBorder component="form" onSubmit={onSubmit} aria-label="Queue a request" maw={640}>
      <Stack gap="sm">
        <Text fw={600}>Queue a request</Text>
        {bookable.length === 0 && <Alert color="yellow">You can queue only for projects where you are an owner or member.</Alert>}
        <Select label="Project" data={bookable.map((m) => ({ value: m.project_slug, label: m.project_name }))} value={project}
          onChange={setProject} error={fieldErr("project")} allowDeselect={false} />
        <TextInput label="Name" value={name} onChange={(e) => setName(e.currentTarget.value)} error={fieldErr("name")} required />
        <SpecFields models={models.data ?? []} value={spec} onChange={setSpec} fieldErr={fieldErr} alternatives />
        <NumberInput label="Duration (hours)" min={0.05} step={0.5} decimalScale={2} value={hours}
          onChange={(v) => setHours(typeof v === "number" ? v : Number(v) || 0)} error={fieldErr("duration")} />
        <DateTimeInput label="Start by (optional)" value={startBy} onChange={setStartBy} error={fieldErr("start_by")} />
        {startBy !== null && (
          <Button variant="subtle" size="xs" onClick={() => setStartBy(null)}>
            No start-by deadline
          </Button>
        )}
        <Radio.Group label="Class" value={priorityClass} onChange={setPriorityClass} error={fieldErr("priority_class")}>
          <Stack gap={6} mt={4}>
            {classes.isError && <Text size="sm" c="red.9">The classes could not be loaded: {classes.error.message}</Text>}
            {(classes.data ?? []).map((c) => (
              <Radio key={c.name} value={c.name} label={classLabel(c.name)} disabled={!c.allowed}
                description={c.allowed ? classDescription(c) : `${classDescription(c)} ${CLASS_NOT_ALLOWED}`} />
            ))}
          </Stack>
        </Radio.Group>
        {chosen?.preemptible && (
          <Checkbox label="Queue it again if it is preempted (resume from your checkpoint)" checked={requeue}
            onChange={(e) => setRequeue(e.currentTarget.checked)} error={fieldErr("requeue")} />
        )}
        <ContainerFields image={image} command={command} onImage={setImage} onCommand={setCommand} fieldErr={fieldErr} />
        <SecretFields project={project} value={secrets} onChange={setSecrets} fieldErr={fieldErr} />
        {problems.length > 0 && (
          <List size="xs" c="red.9" data-testid="queue-problems">
            {problems.map((p) => (
              <List.Item key={p}>{p}</List.Item>
            ))}
          </List>
        )}
        {submit.error && (
          <Alert color="red" title="The request was refused" role="alert" data-testid="queue-error">
            {submit.error.message}
          </Alert>
        )}
        {submit.data && !submit.isPending && !submit.error && (
          <Text size="sm" c="teal.9" role="status" data-testid="queue-submitted">
            Queued “{submit.data.name}”
            {submit.data.position ? `, #${submit.data.position} in the queue` : ""}
            {submit.data.estimated_start ? `; estimated start ${formatDateTime(submit.data.estimated_start)}` : ""}.
          </Text>
        )}
        <Button type="submit" loading={submit.isPending} disabled={problems.length > 0}>
          Queue the request
        </Button>
      </Stack>
    </Card>
  );
}
