import { Badge } from "@mantine/core";

import { classInfo } from "../lib/queue";

/** A queued request's priority class: preemptible work stands out (it may yield its GPUs). */
export function ClassBadge({ name }: { name: string }) {
  const info = classInfo(name);
  const color = info?.preemptible ? "grape" : name === "high" ? "orange" : "gray";
  return (
    <Badge color={color} variant="light" data-testid="class-badge">
      {info?.label ?? name}
    </Badge>
  );
}
