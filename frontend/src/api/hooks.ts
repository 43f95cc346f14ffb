import { useQueries, useQuery } from "@tanstack/react-query";

import { api, getAll, isClientError, type Query } from "./client";
import type {
  Balance,
  GpuModel,
  Me,
  Page,
  PriorityClass,
  QueueEntry,
  QueuedRequest,
  QueuedRequestDetail,
  QuotaPolicy,
  Reservation,
  Server,
  Session,
} from "./types";

/** The signed-in user, or null when signed out. Asked of auth/session/, which answers 200 either way: a signed-out
 * visit is a state, not an error, and logs no failed request in the browser's console. */
export function useMe() {
  return useQuery<Me | null>({
    queryKey: ["me"],
    queryFn: async () => {
      const session = await api.get<Session>("auth/session/");
      return session.authenticated ? session.user : null;
    },
    staleTime: 60_000,
  });
}

/**
 * A `refetchInterval` that polls every `ms` until the query fails with a 4xx (an unknown or forbidden object):
 * the answer will not change, so it is not asked again. A per-query interval overrides the QueryClient's retry
 * rule, which is why a polled query needs this.
 */
export function pollUnlessRefused(ms: number) {
  return (query: { state: { error: unknown } }): number | false => (isClientError(query.state.error) ? false : ms);
}

export function useBalances() {
  return useQuery({
    queryKey: ["balances"],
    queryFn: async () => {
      const data = await api.get<Balance[] | Page<Balance>>("ledger/balances/");
      return Array.isArray(data) ? data : data.results;
    },
  });
}

export function useQuotas() {
  return useQuery({
    queryKey: ["quotas"],
    queryFn: async () => (await api.get<Page<QuotaPolicy>>("ledger/quotas/", { limit: 500 })).results,
  });
}

export function useGpuModels() {
  return useQuery({
    queryKey: ["gpu-models"],
    queryFn: async () => (await api.get<Page<GpuModel>>("gpu-models/", { limit: 500 })).results,
    staleTime: 300_000,
  });
}

export function useServers(refetchMs?: number) {
  return useQuery({
    queryKey: ["servers"],
    queryFn: () => getAll<Server>("servers/"),
    refetchInterval: refetchMs,
  });
}

export function useReservations(query: Query, refetchMs?: number) {
  return useQuery({
    queryKey: ["reservations", query],
    queryFn: async () => api.get<Page<Reservation>>("reservations/", { limit: 100, ...query }),
    refetchInterval: refetchMs,
  });
}

/** The queue's classes and their terms, as operators last set them (priority-classes/): the one source of every
 * class fact the pages show. */
export function usePriorityClasses() {
  return useQuery({
    queryKey: ["priority-classes"],
    queryFn: () => api.get<PriorityClass[]>("priority-classes/"),
    staleTime: 300_000,
  });
}

/** The caller's projects' queued requests (every page: the queue is short-lived, but a project may keep many). */
export function useQueuedRequests(query: Query, refetchMs?: number) {
  return useQuery({
    queryKey: ["requests", query],
    queryFn: () => getAll<QueuedRequest>("requests/", query, 1000),
    refetchInterval: refetchMs,
  });
}

/** The detail of each request still waiting: the list leaves out `position` and `estimated_start`, which cost
 * the server a placement search each, so only the waiting ones are asked. */
export function useRequestDetails(ids: string[], refetchMs?: number) {
  return useQueries({
    queries: ids.map((id) => ({
      queryKey: ["request", id],
      queryFn: () => api.get<QueuedRequestDetail>(`requests/${id}/`),
      refetchInterval: refetchMs,
    })),
  });
}

/** Operators: the whole queue in the pass's order (requests/queue/). Served with the operators' controls; until
 * then it answers 404 and the page says so (isMissingEndpoint). */
export function useOperatorQueue(refetchMs?: number) {
  return useQuery({
    queryKey: ["operator-queue"],
    queryFn: () => api.get<QueueEntry[]>("requests/queue/"),
    refetchInterval: pollUnlessRefused(refetchMs ?? 15_000),
  });
}
