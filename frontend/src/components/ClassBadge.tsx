import { Badge } from "@mantine/core";

import { usePriorityClasses } from "../api/hooks";
import { classInfo, classLabel } from "../lib/queue";

/** A queued request's priority class: preemptible work stands out (it may yield its GPUs). Whether a class is
 * preemptible is the API's answer; until the list has loaded, the class named "preemptible" is taken to be. */
export function ClassBadge({ name }: { name: string }) {
  const info = classInfo(usePriorityClasses().data, name);
  const preemptible = info ? info.preemptible : name === "preemptible";
  const color = preemptible ? "grape" : name === "high" ? "orange" : "gray";
  return (
    <Badge color={color} variant="light" data-testid="class-badge">
      {classLabel(name)}
    </Badge>
  );
}
