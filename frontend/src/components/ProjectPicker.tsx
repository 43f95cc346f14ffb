import { Select } from "@mantine/core";
import { useQuery } from "@tanstack/react-query";

import { api } from "../api/client";
import { useMe } from "../api/hooks";
import type { Page } from "../api/types";

interface ProjectRow {
  id: number;
  slug: string;
  name: string;
}

/**
 * The projects a signed-in user may pick: a tenant's memberships; for an operator, who is a member of none,
 * every project (GET projects/ lists them all to operators).
 */
export function useProjectChoices(): { choices: { value: string; label: string }[]; isLoading: boolean } {
  const me = useMe().data;
  const operator = !!me?.is_operator;
  const projects = useQuery({
    queryKey: ["projects", "all"],
    enabled: operator,
    queryFn: async () => (await api.get<Page<ProjectRow>>("projects/", { limit: 500 })).results,
  });
  const seen = new Map<string, string>();
  for (const m of me?.memberships ?? []) seen.set(m.project_slug, m.project_name);
  for (const p of projects.data ?? []) if (!seen.has(p.slug)) seen.set(p.slug, p.name);
  const choices = [...seen].map(([value, name]) => ({ value, label: `${name} (${value})` }));
  return { choices, isLoading: operator && projects.isLoading };
}

export function ProjectPicker({ value, onChange, choices }: { value: string | null; onChange: (v: string | null) => void; choices: { value: string; label: string }[] }) {
  return (
    <Select label="Project" data={choices} value={value} onChange={onChange} allowDeselect={false} searchable
      placeholder={choices.length ? "Pick a project" : "No projects"} nothingFoundMessage="No such project" />
  );
}
