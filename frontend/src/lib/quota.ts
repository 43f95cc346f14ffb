// What a booking would cost against the project's ledger, computed before asking the server so the form can
// say it up front. The server stays the judge: it re-checks under a lock and its refusal is shown verbatim.

export interface QuotaInput {
  hours: number;
  gpuCount: number;
  /** Credits per GPU-hour for the chosen model (GpuModel.billing_weight, a decimal string). */
  billingWeight: string | number;
  /** Credits available now (Balance.balance: grants minus holds and charges). */
  balance: string | number;
  maxConcurrentGpus?: number | null;
  maxReservationHours?: string | number | null;
}

export interface QuotaEffect {
  creditsNeeded: number;
  balance: number;
  balanceAfter: number;
  fits: boolean;
  /** Sentences naming each limit the request would break; empty when it fits. */
  problems: string[];
}

/** Round to 3 decimals (credits are stored with a few decimals; floats would show 0.30000000000000004). */
export function roundCredits(value: number): number {
  return Math.round(value * 1000) / 1000;
}

export function hoursBetween(start: Date, end: Date): number {
  return (end.getTime() - start.getTime()) / 3_600_000;
}

export function quotaEffect(input: QuotaInput): QuotaEffect {
  const weight = Number(input.billingWeight);
  const balance = Number(input.balance);
  const problems: string[] = [];
  if (!(input.hours > 0)) problems.push("The window must end after it starts.");
  if (!Number.isInteger(input.gpuCount) || input.gpuCount < 1) problems.push("Ask for at least one GPU.");
  const creditsNeeded = roundCredits(Math.max(0, input.hours) * Math.max(0, input.gpuCount) * (weight || 0));
  const balanceAfter = roundCredits(balance - creditsNeeded);
  if (creditsNeeded > balance) {
    problems.push(`Needs ${fmt(creditsNeeded)} credits but the project has ${fmt(balance)}.`);
  }
  if (input.maxConcurrentGpus != null && input.gpuCount > input.maxConcurrentGpus) {
    problems.push(`The project may hold at most ${input.maxConcurrentGpus} GPUs at once.`);
  }
  if (input.maxReservationHours != null && input.maxReservationHours !== "") {
    const max = Number(input.maxReservationHours);
    if (input.hours > max) problems.push(`A reservation may last at most ${fmt(max)} hours.`);
  }
  return { creditsNeeded, balance, balanceAfter, fits: problems.length === 0, problems };
}

function fmt(n: number): string {
  return String(roundCredits(n));
}
