import { useQuery } from "@tanstack/react-query";

import { ApiError, api, type Query } from "./client";
import type { Balance, GpuModel, Me, Page, QuotaPolicy, Reservation, Server } from "./types";

export function useMe() {
  return useQuery<Me | null>({
    queryKey: ["me"],
    queryFn: async () => {
      try {
        return await api.get<Me>("me/");
      } catch (e) {
        // Not signed in is a state, not an error.
        if (e instanceof ApiError && (e.status === 401 || e.status === 403)) return null;
        throw e;
      }
    },
    staleTime: 60_000,
  });
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
    queryFn: async () => (await api.get<Page<Server>>("servers/", { limit: 1000 })).results,
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
