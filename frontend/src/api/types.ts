// Shapes of the public API (see /api/v1/schema/). Decimals arrive as strings and stay strings until shown.
import type { SecretUse } from "../lib/secrets";

export interface Page<T> {
  count: number;
  next: string | null;
  previous: string | null;
  results: T[];
}

export type Role = "owner" | "member" | "viewer";

export interface Me {
  id: number;
  username: string;
  is_operator: boolean;
  memberships: { project_id: number; project_slug: string; project_name: string; role: Role }[];
}

/** GET auth/session/: 200 signed in or not. */
export type Session = { authenticated: true; user: Me } | { authenticated: false; user: null };

export interface Balance {
  project: string;
  balance: string;
  held: string;
  by_kind: Record<string, string>;
}

export interface QuotaPolicy {
  project: string;
  credits_per_period: string;
  period: string;
  max_concurrent_gpus: number | null;
  max_reservation_hours: string | null;
  updated_at: string;
}

export type GpuVendor = "nvidia" | "amd";

export interface GpuModel {
  id: number;
  name: string;
  product_name: string;
  vendor: GpuVendor;
  memory_mib: number;
  price_per_gpu_hour: string;
  currency: string;
  billing_weight: string;
}

export type ReservationState =
  | "pending"
  | "scheduled"
  | "starting"
  | "running"
  | "ending"
  | "completed"
  | "cancelled"
  | "failed"
  | "interrupted";

export interface Spec {
  gpu_model: string | null;
  min_memory_mib: number | null;
  gpu_count: number | null;
  whole_servers: number | null;
}

/** What a reservation costs (docs/api.md, "Cost"); credits are decimal strings. */
export interface ReservationCost {
  credits_per_hour: string;
  booked_credits: string;
  elapsed_seconds: number;
  gpu_hours: string;
  credits_so_far: string;
  /** Its class's price factor ("1.500" high, "1.000", "0.500" preemptible), already in credits_per_hour. */
  credit_multiplier?: string;
  /** What the ledger charged, once the reservation ended; null before. */
  credits_charged: string | null;
}

/** GET reservations/{id}/extend-quote/?ends_at=: the price of an extension and whether it would be accepted. */
export interface ExtendQuote {
  ends_at: string;
  current_ends_at: string;
  extra_hours: string;
  credits_per_hour: string;
  extra_credits: string;
  allowed: boolean;
  gpus_free: boolean;
  refusal: { code: string; message: string; free_until?: string } | null;
  /** What extend/ would be told and let through: a budget past its cap whose action is warn. */
  warnings: BookingWarning[];
}

/** A booking's or extension's warning (code budget_exceeded): made anyway, and told why. */
export interface BookingWarning {
  code: string;
  message: string;
}

export interface Reservation {
  id: string;
  cost: ReservationCost;
  project: string;
  name: string;
  state: ReservationState;
  spec: Spec;
  starts_at: string;
  ends_at: string;
  image: string;
  command: string[] | null;
  env: Record<string, string> | null;
  created_by: string | null;
  created_at: string;
  updated_at: string;
  /** Class terms set at booking (docs/api.md, "Reservations"); preempted_by: the winner's id, or null. */
  preemptible?: boolean;
  notice_seconds?: number;
  credit_multiplier?: string;
  preempted_by?: string | null;
  /** The project secrets it gets, by name (docs/images.md); values are never in an answer. */
  secrets?: SecretUse[];
  /** The launch template it was booked from (docs/templates.md), or null. */
  template?: string | null;
  /** What the container serves, by name (`container.ports`, normalised with every key; docs/access.md). */
  ports?: ContainerPort[];
}

export type PortProtocol = "http" | "https" | "tcp";

/** A port the container serves: `path` is where Open lands; auth "jupyter" opens JupyterLab signed in. */
export interface ContainerPort {
  name: string;
  port: number;
  protocol: PortProtocol;
  path: string;
  auth: "none" | "jupyter";
}

/** An http port the proxy serves now (`access.web`): `url` is the app's stable address, without a token. */
export interface WebApp extends ContainerPort {
  url: string;
}

/** POST reservations/{id}/open/: a one-time signed link (60 s) that signs the browser in to the app. */
export interface OpenedApp {
  name: string;
  url: string;
  app_url: string;
  expires_at: string;
}

/** POST reservations/{id}/terminal/: a one-time WebSocket address (60 s) for a shell in the container. */
export interface TerminalTicket {
  url: string;
  expires_at: string;
  server: string;
}

export interface Allocation {
  gpu: string;
  server: string;
  index: number;
  gpu_model: string;
  starts_at: string;
  ends_at: string;
  active: boolean;
  released_at: string | null;
}

export interface ReservationEvent {
  from_state: string;
  to_state: string;
  actor_label: string;
  reason: string;
  data: unknown;
  at: string;
}

export interface SshAccess {
  server: string;
  host: string;
  port: number;
  user: string;
  command: string;
  known_hosts: string;
}

export interface ReservationAccess {
  ready: boolean;
  message: string;
  ssh: SshAccess[];
  /** The web apps the proxy serves now (only while ready); absent from a server without the proxy. */
  web?: WebApp[];
  /** Whether a web terminal can be opened now. */
  terminal?: boolean;
}

export interface ReservationMount {
  kind: "volume" | "dataset";
  name: string;
  path: string;
  read_only: boolean;
}

export interface ReservationDetail extends Reservation {
  volumes: ReservationMount[];
  network: string;
  allocations: Allocation[];
  events: ReservationEvent[];
  access: ReservationAccess;
  /** Per server, what the container gets besides its GPUs (docs/reservations.md, "Resources"). */
  container_resources?: ContainerResources[];
}

export interface ContainerResources {
  server: string;
  gpu_share: number;
  /** null: not limited (notes say why). */
  cpus: number | null;
  memory_mib: number | null;
  shm_mib: number;
  ulimits: { name: string; soft: number; hard: number }[];
  notes: string[];
}

/** A launch template (docs/templates.md): a booking's container and spec, named ports and a window length. */
export interface LaunchTemplate {
  project: string | null;
  name: string;
  title: string;
  description: string;
  container: {
    image: string;
    command: string[];
    env: Record<string, string>;
    secrets: { name: string; env?: string; file?: string }[];
    volumes: Record<string, unknown>[];
    network: string;
  };
  spec: { gpu_model?: string; min_memory_mib?: number; gpu_count?: number; whole_servers?: number } | null;
  /** Its named ports; a booking from it gets them unless it gives its own. `path` and `auth` may be absent. */
  ports: (Pick<ContainerPort, "name" | "port" | "protocol"> & Partial<Pick<ContainerPort, "path" | "auth">>)[];
  /** The default window length, in seconds. */
  duration: number;
}

export type ServerState = "commissioning" | "ready" | "draining" | "maintenance" | "offline" | "retired";

export interface ServerGpu {
  id: number;
  uuid: string;
  index: number;
  model: string;
  product_name: string;
  memory_mib: number;
  present: boolean;
  health: "healthy" | "unhealthy";
  vendor: GpuVendor;
  /** Null when the GPU cannot do MIG. */
  mig_mode: { current: boolean; pending: boolean } | null;
  mig_devices: MigDevice[];
  // Operator-only fields below; absent for tenants.
  mig_desired?: { enabled: boolean; layout: string[] } | null;
  mig_change?: "" | "applying" | "reset_required" | "refused";
  pci_bus_id?: string;
  health_reasons?: unknown;
  needs_acknowledgement?: boolean;
  telemetry?: Record<string, number | null> | null;
  telemetry_at?: string | null;
  last_seen_at?: string | null;
}

export interface MigDevice {
  uuid: string;
  profile: string;
  memory_mib: number | null;
  compute_slices: number | null;
  memory_slices: number | null;
  placement_start: number | null;
}

export interface Server {
  id: number;
  hostname: string;
  state: ServerState;
  site: string | null;
  rack: string;
  simulated: boolean;
  gpus: ServerGpu[];
  agent_version?: string;
  last_heartbeat_at?: string | null;
  /** Operators: what the GPUs draw now against the server's rated power (docs/efficiency.md). */
  power?: ServerPower;
}

export interface ServerPower {
  drawn_w: number | null;
  rated_w: number | null;
  share: number | null;
  gpus_reporting: number;
}

export interface TimelineSegment {
  starts_at: string;
  ends_at: string;
  active: boolean;
  mine: boolean;
  reservation: string | null;
  project: string | null;
  /** Held by a preemptible reservation: capacity a non-preemptible booking can take after its notice. */
  yielding?: boolean;
}

export interface TimelineGpu {
  gpu: string;
  server: string;
  index: number;
  gpu_model: string;
  server_state: string;
  health: string;
  /** Set while the GPU cannot be booked: its server is not ready, or it is unhealthy. */
  unavailable: { reason: "draining" | "maintenance" | "offline" | "commissioning" | "unhealthy"; detail: string } | null;
  segments: TimelineSegment[];
}

export interface TimelineAnswer {
  start: string;
  end: string;
  count: number;
  gpus: TimelineGpu[];
}

export interface FreeAnswer {
  start: string;
  end: string;
  free_gpus: number;
  servers: { hostname: string; free: string[]; whole: boolean }[];
  proposal: string[] | null;
  // A slice search's profile (free and proposal are then MIG device uuids); null for whole GPUs.
  mig_profile: string | null;
}

export interface EarliestAnswer {
  found: boolean;
  start: string | null;
  end: string | null;
  gpus: string[];
  mig_profile: string | null;
}

export interface ApiToken {
  id: number;
  name: string;
  prefix: string;
  created_at: string;
  expires_at: string | null;
  revoked_at: string | null;
  last_used_at: string | null;
  active: boolean;
}

export interface ApiTokenCreated extends ApiToken {
  token: string;
}

export interface JoinToken {
  id: number;
  lookup: string;
  note: string;
  status: string;
  created_by: string;
  created_at: string;
  expires_at: string;
  used_at: string | null;
  server: string;
  revoked_at: string | null;
}

export interface JoinTokenIssued extends JoinToken {
  token: string;
}

/** DCGM field names the agent reports (nodeagent/schema.py); any of them may be missing on a GPU. */
export const DCGM = {
  util: "DCGM_FI_DEV_GPU_UTIL",
  fbUsed: "DCGM_FI_DEV_FB_USED",
  fbTotal: "DCGM_FI_DEV_FB_TOTAL",
  temp: "DCGM_FI_DEV_GPU_TEMP",
  power: "DCGM_FI_DEV_POWER_USAGE",
  energy: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
} as const;

/** GET reservations/{id}/telemetry/: figures only from inside the period the reservation held each GPU. */
export interface TelemetryMinute {
  minute: string;
  samples: number;
  util_avg: number | null;
  util_max: number | null;
  fb_used_max_mib: number | null;
  power_avg_w: number | null;
  temp_max_c: number | null;
  /** DCGM's profiling fields, ratios 0..1; null on a GPU without them (no GPM). */
  sm_active_avg?: number | null;
  tensor_active_avg?: number | null;
  dram_active_avg?: number | null;
}

export interface GpuTelemetry {
  uuid: string;
  index: number;
  server: string;
  model: string;
  memory_mib: number;
  simulated: boolean;
  held_from: string;
  held_until: string;
  live: boolean;
  latest: { at: string; values: Record<string, number | null> } | null;
  minutes: TelemetryMinute[];
}

export interface ReservationTelemetry {
  reservation: string;
  state: string;
  now: string;
  since: string;
  gpus: GpuTelemetry[];
}

export interface SshKey {
  id: number;
  name: string;
  key_type: string;
  bits: number;
  fingerprint: string;
  public_key: string;
  comment: string;
  created_at: string;
}

// Notifications (docs/notifications.md).
export interface AppNotification {
  id: number;
  type: string;
  title: string;
  body: string;
  unread: boolean;
  read_at: string | null;
  created_at: string;
  occurred_at: string;
  reservation: string | null;
  project: string | null;
  link: string;
}

export type NotificationChannel = "email" | "webhook" | "none";

export interface NotificationPreference {
  event_type: string;
  description: string;
  channel: NotificationChannel;
  default_channel: NotificationChannel;
}

export interface WebhookEndpoint {
  id: string;
  url: string;
  description: string;
  events: string[];
  enabled: boolean;
  disabled_reason: string;
  disabled_at: string | null;
  secret: string;
  previous_secret_expires_at: string | null;
  created_at: string;
}

export interface WebhookDelivery {
  id: number;
  event_id: string;
  type: string;
  state: "pending" | "delivered" | "failed";
  attempts: number;
  last_status_code: number | null;
  last_response: string;
  last_error: string;
  next_attempt_at: string | null;
  created_at: string;
  delivered_at: string | null;
  history: { attempt: number; at: string; status_code: number | null; error: string; ms: number }[];
}

export interface OutboxEmail {
  id: number;
  to_address: string;
  subject: string;
  body_text: string;
  body_html: string;
  state: string;
  attempts: number;
  last_error: string;
  created_at: string;
  sent_at: string | null;
}

/** GET reservations/{id}/idle/: the reservation's idle reclamation, if it was ever found idle. */
export interface IdleReclamation {
  state: "warned" | "kept" | "reclaimed";
  warned_at: string;
  util_percent: number;
  threshold_percent: string;
  idle_minutes: number;
  booked_ends_at: string;
  cut_ends_at: string;
  kept_at: string | null;
  kept_by: string | null;
  reclaimed_at: string | null;
  reclaimed_gpu_hours: number;
}

/** A queued request's state (docs/scheduling.md); `held` comes with the operators' controls, when served. */
export type QueuedRequestState = "queued" | "held" | "started" | "cancelled" | "failed" | string;

export interface QueuedRequestEvent {
  from_state: string;
  to_state: string;
  actor_label: string;
  reason: string;
  at: string;
}

/** GET requests/ (a list row); the detail adds `position`, `estimated_start` and the events. */
export interface QueuedRequest {
  id: string;
  project: string;
  name: string;
  spec: Spec;
  container: { image?: string; command?: string[]; env?: Record<string, string> } | null;
  duration_seconds: number;
  start_by: string | null;
  priority_class: string;
  state: QueuedRequestState;
  reason: string;
  /** The reservation it booked, once started. */
  reservation: string | null;
  requeue: boolean;
  requeued_from: string | null;
  created_at: string;
  started_at: string | null;
  /** The reservation whose end frees its GPUs, and when (operators' controls; absent until served). */
  blocked_by?: string | null;
  blocked_until?: string | null;
}

export interface QueuedRequestDetail extends QueuedRequest {
  position: number | null;
  estimated_start: string | null;
  events: QueuedRequestEvent[];
}

/** GET priority-classes/: the queue's classes as the database holds them, the most urgent first. */
export interface PriorityClass {
  name: string;
  rank: number;
  /** A string decimal ("0.500"): bookings in the class are charged the booking rate times it. */
  credit_multiplier: string;
  /** The checkpoint notice a preemptible reservation gets before it yields its GPUs. */
  notice_seconds: number;
  preemptible: boolean;
  restricted: boolean;
  /** Whether the caller may submit in it for at least one of their projects. */
  allowed: boolean;
}

/** GET requests/queue/ (operators): one row of the whole queue in the pass's order, then the held ones. Every
 * field past the core is optional: the endpoint may not be served yet, or may grow. */
export interface QueueEntry {
  position: number | null;
  id: string;
  project: string;
  name: string;
  priority_class: string;
  state: string;
  /** What it waits for, in words: "4 x H100-80GB". */
  spec: string;
  duration_seconds: number;
  fair_share_factor?: number | null;
  reason: string;
  blocked_by?: string | null;
  blocked_until?: string | null;
  created_at: string;
}
