import type { LaunchTemplate } from "../api/types";

/** What picking a launch template puts in the booking form: its name, image, command (as the form's words),
 * the GPU model and count where its spec gives them, its web ports, and the end its window length gives from
 * `start`. */
export interface TemplateFill {
  name: string;
  image: string;
  command: string;
  model: string | null;
  count: number | null;
  ports: LaunchTemplate["ports"];
  end: number;
}

export function templateFill(t: LaunchTemplate, start: number): TemplateFill {
  return {
    name: t.name,
    image: t.container.image,
    command: (t.container.command ?? []).join(" "),
    model: t.spec?.gpu_model ?? null,
    count: t.spec?.gpu_count ?? null,
    ports: t.ports ?? [],
    end: start + t.duration * 1000,
  };
}

/** The picker's label: the title, else the name, and whose it is. */
export function templateLabel(t: LaunchTemplate): string {
  const scope = t.project ? t.project : "operator";
  return `${t.title || t.name} (${t.name}, ${scope})`;
}
