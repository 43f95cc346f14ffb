import { useQuery } from "@tanstack/react-query";

import { api, isClientError, type Query } from "./client";
import type { Balance, GpuModel, Me, Page, QuotaPolicy, Reservation, Server, Session } from "./types";

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
    // 500: the largest page the API serves (core/api/pagination.py); asking for more is refused with a 400.
    queryFn: async () => (await api.get<Page<Server>>("servers/", { limit: 500 })).results,
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
