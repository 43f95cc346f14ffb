import {
  Alert,
  Button,
  Card,
  Checkbox,
  Grid,
  Group,
  List,
  SegmentedControl,
  Select,
  Stack,
  Text,
  TextInput,
  Title,
} from "@mantine/core";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useEffect, useMemo, useState, type FormEvent } from "react";
import { useNavigate } from "react-router";

import { ApiError, api } from "../api/client";
import { useBalances, useGpuModels, useMe, useQuotas, useServers } from "../api/hooks";
import type { EarliestAnswer, FreeAnswer, LaunchTemplate, Page, ReservationDetail, TimelineAnswer } from "../api/types";
import { ErrorAlert, QueryState } from "../components/QueryState";
import { ContainerFields, SecretFields, SpecFields } from "../components/BookingFields";
import { PortFields } from "../components/PortFields";
import { DateTimeInput } from "../components/DateTimeInput";
import { Timeline } from "../components/Timeline";
import { useShownZone } from "../components/ZoneToggle";
import { formatCredits, formatDateTime, formatHours, formatRelative, zoneLabel } from "../lib/format";
import { commandWords } from "../lib/queue";
import { portProblems, portRows, portsBody, type PortRow } from "../lib/ports";
import { hoursBetween, quotaEffect } from "../lib/quota";
import { secretProblems, secretsBody, warningsOf, type SecretChoice } from "../lib/secrets";
import { templateFill, templateLabel } from "../lib/templates";

const HOUR = 3_600_000;

function nextHour(): Date {
  return new Date(Math.ceil((Date.now() + 60_000) / HOUR) * HOUR);
}

export function AvailabilityPage() {
  const me = useMe().data!;
  const models = useGpuModels();
  const servers = useServers();
  const balances = useBalances();
  const quotas = useQuotas();
  const navigate = useNavigate();
  const queryClient = useQueryClient();

  const bookable = me.memberships.filter((m) => m.role !== "viewer");
  const [days, setDays] = useState("3");
  // The booking needs a model (the server asks for a model or a memory floor); the timeline may show all.
  const [model, setModel] = useState<string | null>(null);
  const [viewModel, setViewModel] = useState<string | null>(null);
  useEffect(() => {
    if (!model && models.data?.length) setModel(models.data[0].name);
  }, [model, models.data]);
  const [count, setCount] = useState<number>(1);
  const [project, setProject] = useState<string | null>(bookable[0]?.project_slug ?? null);
  const zone = useShownZone();
  const [start, setStart] = useState<number>(() => nextHour().getTime());
  const [end, setEnd] = useState<number>(() => nextHour().getTime() + 2 * HOUR);
  const [startNow, setStartNow] = useState(false);
  const [name, setName] = useState("training run");
  // The demo fleet's local image; no registry is assumed.
  const [image, setImage] = useState("gpucp-busybox:test");
  const [command, setCommand] = useState("");
  const [secrets, setSecrets] = useState<SecretChoice[]>([]);
  const [ports, setPorts] = useState<PortRow[]>([]);
  // A launch template (docs/templates.md): picking one fills the form; the booking names it, so what the form
  // does not show (env, secrets, volumes, network) comes from the template on the server.
  const [template, setTemplate] = useState<string | null>(null);
  const templates = useQuery({
    queryKey: ["templates", project],
    enabled: !!project,
    queryFn: async () => (await api.get<Page<LaunchTemplate>>("templates/", { project, limit: 200 })).results,
  });
  // Another project has other templates: the pick does not carry over.
  useEffect(() => setTemplate(null), [project]);
  function pickTemplate(picked: string | null) {
    setTemplate(picked);
    const t = templates.data?.find((x) => x.name === picked);
    if (!t) return;
    const fill = templateFill(t, startNow ? Date.now() : start);
    setName(fill.name);
    setImage(fill.image);
    setCommand(fill.command);
    if (fill.model && models.data?.some((m) => m.name === fill.model)) {
      setModel(fill.model);
      setViewModel(fill.model);
    }
    if (fill.count) setCount(fill.count);
    setPorts(portRows(fill.ports));
    setEnd(fill.end);
  }

  // The visible range is fixed per page view so the timeline does not shift under the pointer.
  const rangeStart = useMemo(() => Math.floor(Date.now() / HOUR) * HOUR, []);
  const range = { start: rangeStart, end: rangeStart + Number(days) * 24 * HOUR };
  const timeline = useQuery({
    queryKey: ["timeline", range.start, range.end, viewModel],
    queryFn: () =>
      api.get<TimelineAnswer>("availability/timeline/", {
        start: new Date(range.start).toISOString(),
        end: new Date(range.end).toISOString(),
        gpu_model: viewModel,
        limit: 1000,
      }),
    refetchInterval: 15_000,
  });

  const startDate = startNow ? new Date() : new Date(start);
  const endDate = new Date(end);
  const windowOk = endDate > startDate;
  const hours = windowOk ? hoursBetween(startDate, endDate) : 0;
  const startsInPast = !startNow && start < Date.now() - 60_000;

  const free = useQuery({
    queryKey: ["free", startNow ? "now" : start, end, model, count],
    enabled: windowOk && count >= 1 && !!model,
    queryFn: () =>
      api.get<FreeAnswer>("availability/free/", {
        // "now" is the server's instant, as the booking will be.
        start: startNow ? "now" : startDate.toISOString(),
        end: endDate.toISOString(),
        gpu_model: model,
        gpu_count: count,
      }),
  });

  const earliest = useMutation({
    mutationFn: () =>
      api.get<EarliestAnswer>("availability/earliest/", {
        duration_hours: Math.max(0.01, Math.round(hours * 1000) / 1000 || 1),
        gpu_count: count,
        gpu_model: model,
        within_days: 14,
      }),
    onSuccess: (answer) => {
      if (answer.found && answer.start && answer.end) {
        setStartNow(false);
        setStart(Date.parse(answer.start));
        setEnd(Date.parse(answer.end));
      }
    },
  });

  const modelInfo = models.data?.find((m) => m.name === model);
  const balance = balances.data?.find((b) => b.project === project);
  const quota = quotas.data?.find((q) => q.project === project);
  const weight = modelInfo?.billing_weight ?? "0";
  const effect = quotaEffect({
    hours,
    gpuCount: count,
    billingWeight: weight,
    balance: balance?.balance ?? 0,
    maxConcurrentGpus: quota?.max_concurrent_gpus,
    maxReservationHours: quota?.max_reservation_hours,
  });

  const book = useMutation({
    mutationFn: () =>
      api.post<ReservationDetail>("reservations/", {
        project,
        name,
        ...(template ? { template } : {}),
        spec: { gpu_model: model, gpu_count: count },
        // "now" lets the server pick the instant, so a slow click never books a window already begun.
        window: { start: startNow ? "now" : startDate.toISOString(), end: endDate.toISOString() },
        container: {
          image,
          command: commandWords(command),
          env: {},
          ...(secrets.length ? { secrets: secretsBody(secrets) } : {}),
          // With a template, the rows are its ports as the form left them: none left means none.
          ...(ports.length || template ? { ports: portsBody(ports) } : {}),
        },
      }),
    onSuccess: async (r) => {
      await queryClient.invalidateQueries();
      // What the booking was let through with (an image not checked, a budget past its cap) is in this answer
      // only: the reservation page shows it once.
      navigate(`/reservations/${r.id}`, { state: { warnings: warningsOf(r) } });
    },
  });
  const bookError = book.error instanceof ApiError ? book.error : null;
  const fieldErr = (...names: string[]) => names.map((n) => bookError?.fieldError(n)).find(Boolean);

  // Never offer a booking the server would refuse: the quota's problems, a start already past, or a window
  // the free check says does not fit keep the Book button disabled, with the reasons listed.
  const problems = [
    ...(startsInPast ? ["The start is in the past: pick a later start, or Start now."] : []),
    ...effect.problems,
    ...secretProblems(secrets),
    ...portProblems(ports),
  ];
  const fits = !free.data || (free.data.proposal !== null && free.data.free_gpus >= count);
  const canBook = !!project && windowOk && count >= 1 && problems.length === 0 && fits;

  function submit(e: FormEvent) {
    e.preventDefault();
    if (canBook) book.mutate();
  }

  /** A pick on the timeline: at or before now means "start now"; the window keeps its length. */
  function pickStart(t: number) {
    const dur = windowOk ? endDate.getTime() - startDate.getTime() : 2 * HOUR;
    const current = Date.now();
    if (t <= current + 60_000) {
      setStartNow(true);
      setStart(current);
      setEnd(current + dur);
    } else {
      setStartNow(false);
      setStart(t);
      setEnd(t + dur);
    }
  }

  const pickText = windowOk
    ? `${startNow ? "starts now" : `starts ${formatDateTime(start, zone)}, ${formatRelative(new Date(start).toISOString())}`}; ends ${formatDateTime(end, zone)} (${zoneLabel(zone)})`
    : "no window picked";
  const pickGpus = useMemo(() => new Set(free.data?.proposal ?? []), [free.data]);

  const simulatedHosts = new Set((servers.data ?? []).filter((s) => s.simulated).map((s) => s.hostname));

  return (
    <Stack>
      <Title order={1} size="h2">
        Book GPUs
      </Title>
      <Grid>
        <Grid.Col span={{ base: 12, lg: 8 }}>
          <Card withBorder>
            <Group justify="space-between" mb="xs">
              <Text fw={600}>Availability</Text>
              <Group gap="xs">
                <Select
                  aria-label="GPU model shown"
                  placeholder="Any GPU model"
                  clearable
                  size="xs"
                  data={(models.data ?? []).map((m) => ({ value: m.name, label: m.name }))}
                  value={viewModel}
                  onChange={setViewModel}
                />
                <SegmentedControl
                  size="xs"
                  aria-label="Days shown"
                  value={days}
                  onChange={setDays}
                  data={[
                    { value: "1", label: "1 day" },
                    { value: "3", label: "3 days" },
                    { value: "7", label: "7 days" },
                  ]}
                />
              </Group>
            </Group>
            <Text size="xs" c="dimmed" mb="xs">
              Green is free, grey booked by others, blue your projects', hatched not bookable now (the reason beside the
              server). Light hatched segments with a dashed edge are preemptible work: a booking can take those GPUs,
              after the holder's notice. Yellow is your window, on the GPUs a booking would get. Click a track (or focus the first one and use
              the arrow keys) to start your window there; a click at the red "now" line starts it now.
            </Text>
            <QueryState
              isLoading={timeline.isLoading}
              error={timeline.error}
              isEmpty={timeline.data?.gpus.length === 0}
              empty="No GPUs match. Try another model, or ask an operator whether servers are enrolled."
              label="the timeline"
            >
              {timeline.data && (
                <Timeline
                  range={range}
                  gpus={timeline.data.gpus}
                  simulatedHosts={simulatedHosts}
                  pick={windowOk ? { start: startDate.getTime(), end: endDate.getTime() } : null}
                  pickGpus={pickGpus}
                  pickText={pickText}
                  onPick={pickStart}
                />
              )}
            </QueryState>
          </Card>
        </Grid.Col>
        <Grid.Col span={{ base: 12, lg: 4 }}>
          <Card withBorder component="form" onSubmit={submit} aria-label="Booking">
            <Stack gap="sm">
              <Text fw={600}>Your booking</Text>
              {bookable.length === 0 && (
                <Alert color="yellow">You can book only for projects where you are an owner or member.</Alert>
              )}
              <Select
                label="Project"
                data={bookable.map((m) => ({ value: m.project_slug, label: m.project_name }))}
                value={project}
                onChange={setProject}
                error={fieldErr("project")}
                allowDeselect={false}
              />
              <Select
                label="Template"
                description="Fills the form; its env, secrets and mounts come with it"
                placeholder="None"
                clearable
                data={(templates.data ?? []).map((t) => ({ value: t.name, label: templateLabel(t) }))}
                value={template}
                onChange={pickTemplate}
                error={fieldErr("template")}
                data-testid="template-picker"
              />
              <SpecFields
                models={models.data ?? []}
                value={{ by: "model", model, minMemoryGib: 0, size: "gpus", count }}
                onChange={(next) => {
                  if (next.model !== model) {
                    setModel(next.model);
                    setViewModel(next.model);
                  }
                  setCount(next.count);
                }}
                fieldErr={fieldErr}
              />
              <Checkbox
                label="Start now"
                checked={startNow}
                onChange={(e) => {
                  const on = e.currentTarget.checked;
                  setStartNow(on);
                  if (!on) setStart(Math.max(start, nextHour().getTime()));
                }}
              />
              <DateTimeInput
                label="Start"
                disabled={startNow}
                value={startNow ? startDate.getTime() : start}
                onChange={setStart}
                error={fieldErr("window.start", "window")}
              />
              <DateTimeInput
                label="End"
                value={end}
                onChange={setEnd}
                error={fieldErr("window.end", "window.duration") ?? (!windowOk ? "The window must end after it starts." : undefined)}
              />
              <Button variant="light" size="xs" onClick={() => earliest.mutate()} loading={earliest.isPending}
                disabled={count < 1 || !model}>
                Find the earliest window of this length
              </Button>
              {earliest.data && !earliest.data.found && (
                <Text size="xs" c="red.9">No window of {formatHours(hours)} fits in the next 14 days.</Text>
              )}
              {earliest.error && <ErrorAlert error={earliest.error} title="Could not search" />}

              <FreeLine loading={free.isFetching} error={free.error} answer={free.data} count={count} />

              <Card withBorder bg="var(--mantine-color-gray-0)" p="xs" data-testid="quota-effect">
                <Text size="sm" fw={600}>Quota effect</Text>
                <Text size="sm">
                  {formatHours(hours)} × {count} GPU × {formatCredits(weight)} credits ={" "}
                  <b>{formatCredits(effect.creditsNeeded)} credits</b>
                </Text>
                <Text size="sm">
                  Balance {formatCredits(effect.balance)} → {formatCredits(effect.balanceAfter)} after booking
                </Text>
                {problems.length > 0 && (
                  <List size="xs" c="red.9" mt={4} data-testid="booking-problems">
                    {problems.map((p) => (
                      <List.Item key={p}>{p}</List.Item>
                    ))}
                  </List>
                )}
              </Card>

              <TextInput label="Name" value={name} onChange={(e) => setName(e.currentTarget.value)} error={fieldErr("name")} required />
              <ContainerFields image={image} command={command} onImage={setImage} onCommand={setCommand} fieldErr={fieldErr} />
              <SecretFields project={project} value={secrets} onChange={setSecrets} fieldErr={fieldErr} />
              <PortFields value={ports} onChange={setPorts} fieldErr={fieldErr} />

              {book.error && (
                <Alert color="red" title="The booking was refused" role="alert" data-testid="book-error">
                  {book.error.message}
                </Alert>
              )}
              <Button type="submit" loading={book.isPending} disabled={!canBook} aria-describedby={canBook ? undefined : "book-why"}>
                Book {count} GPU{count === 1 ? "" : "s"}
              </Button>
              {!canBook && (
                <Text size="xs" id="book-why" data-testid="book-why">
                  {problems.length > 0
                    ? "Booking is not offered while the problems above are listed."
                    : !fits
                      ? "Booking is not offered: the window does not fit, see above."
                      : "Pick a project, a window and at least one GPU to book."}
                </Text>
              )}
            </Stack>
          </Card>
        </Grid.Col>
      </Grid>
    </Stack>
  );
}

function FreeLine(props: { loading: boolean; error: unknown; answer?: FreeAnswer; count: number }) {
  if (props.error) return <ErrorAlert error={props.error} title="Could not check this window" />;
  if (!props.answer) return props.loading ? <Text size="xs" c="dimmed">Checking the window…</Text> : null;
  const a = props.answer;
  const enough = a.proposal !== null && a.free_gpus >= props.count;
  return (
    <Text size="sm" c={enough ? "teal.9" : "red.9"} data-testid="free-line">
      {a.free_gpus} GPU{a.free_gpus === 1 ? "" : "s"} free from {formatDateTime(a.start)} to {formatDateTime(a.end)}
      {enough ? "; your request fits." : "; not enough for your request."}
    </Text>
  );
}
