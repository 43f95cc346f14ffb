import { Table, type TableProps } from "@mantine/core";
import type { CSSProperties } from "react";

/**
 * A table that scrolls sideways on a wide screen narrower than `minWidth`, and shows each row as a card on a
 * phone (below 36em, app.css "Cards on narrow screens"): every cell on its own line, named by its
 * `data-label`, so nothing is cut. Give each <Table.Td> a `data-label` equal to its column's header; a cell
 * without one (an actions cell) shows its content alone.
 */
export function ResponsiveTable({ minWidth, className, ...props }: TableProps & { minWidth?: number }) {
  const style = minWidth ? ({ "--rt-min-width": `${minWidth}px` } as CSSProperties) : undefined;
  return (
    <div className="rt-scroll" style={style}>
      <Table {...props} className={["rt-cards", className].filter(Boolean).join(" ")} />
    </div>
  );
}
