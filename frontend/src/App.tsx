import { Anchor, AppShell, Burger, Button, Center, Group, Loader, NavLink, Stack, Text, Title } from "@mantine/core";
import { useDisclosure } from "@mantine/hooks";
import { useQueryClient } from "@tanstack/react-query";
import { lazy, Suspense } from "react";
import { Navigate, Route, Routes, useLocation, useNavigate, Link } from "react-router";

import { api } from "./api/client";
import { useMe } from "./api/hooks";
import { NotificationBell } from "./components/NotificationBell";
import { ErrorAlert } from "./components/QueryState";
import { useShownZone, ZoneToggle } from "./components/ZoneToggle";
import { DashboardPage } from "./pages/Dashboard";
import { safeNext } from "./lib/redirect";
import { LoginPage } from "./pages/Login";

// The pages with charts pull in recharts, the largest part of the bundle; they load when first visited, so
// the sign-in page and the dashboard do not wait for it.
const AccountingPage = lazy(() => import("./pages/Accounting").then((m) => ({ default: m.AccountingPage })));
const AvailabilityPage = lazy(() => import("./pages/Availability").then((m) => ({ default: m.AvailabilityPage })));
const HistoryPage = lazy(() => import("./pages/History").then((m) => ({ default: m.HistoryPage })));
const FleetPage = lazy(() => import("./pages/Fleet").then((m) => ({ default: m.FleetPage })));
const JoinTokensPage = lazy(() => import("./pages/JoinTokens").then((m) => ({ default: m.JoinTokensPage })));
const QueuePage = lazy(() => import("./pages/Queue").then((m) => ({ default: m.QueuePage })));
const OperatorQueuePage = lazy(() => import("./pages/OperatorQueue").then((m) => ({ default: m.OperatorQueuePage })));
const ReservationPage = lazy(() => import("./pages/Reservation").then((m) => ({ default: m.ReservationPage })));
const TokensPage = lazy(() => import("./pages/Tokens").then((m) => ({ default: m.TokensPage })));
const SshKeysPage = lazy(() => import("./pages/SshKeys").then((m) => ({ default: m.SshKeysPage })));
const EfficiencyPage = lazy(() => import("./pages/Efficiency").then((m) => ({ default: m.EfficiencyPage })));
const UsagePage = lazy(() => import("./pages/Usage").then((m) => ({ default: m.UsagePage })));
const NotificationsPage = lazy(() => import("./pages/Notifications").then((m) => ({ default: m.NotificationsPage })));
const WebhooksPage = lazy(() => import("./pages/Webhooks").then((m) => ({ default: m.WebhooksPage })));
const VolumesPage = lazy(() => import("./pages/Volumes").then((m) => ({ default: m.VolumesPage })));
const SecretsPage = lazy(() => import("./pages/Secrets").then((m) => ({ default: m.SecretsPage })));

const TENANT_LINKS = [
  { to: "/", label: "Dashboard" },
  { to: "/availability", label: "Book GPUs" },
  { to: "/queue", label: "Queue" },
  { to: "/history", label: "History" },
  { to: "/usage", label: "Usage" },
  { to: "/efficiency", label: "Efficiency" },
  { to: "/volumes", label: "Volumes" },
  { to: "/secrets", label: "Secrets & registries" },
  { to: "/tokens", label: "API tokens" },
  { to: "/ssh-keys", label: "SSH keys" },
  { to: "/notifications", label: "Notifications" },
  { to: "/webhooks", label: "Webhooks" },
];
const OPERATOR_LINKS = [
  { to: "/fleet", label: "Fleet health" },
  { to: "/operator-queue", label: "Whole queue" },
  { to: "/join-tokens", label: "Join tokens" },
  { to: "/accounting", label: "Accounting" },
];

export function App() {
  const me = useMe();
  const location = useLocation();
  useShownZone(); // every page's times follow the header's zone toggle

  if (me.isLoading) {
    return (
      <Center h="100vh">
        <Loader aria-label="Loading" />
      </Center>
    );
  }
  if (me.error) {
    return (
      <Center h="100vh" p="md">
        <ErrorAlert error={me.error} title="The control plane could not be reached" />
      </Center>
    );
  }
  if (!me.data) {
    return (
      <Routes>
        <Route path="/login" element={<LoginPage />} />
        <Route
          path="*"
          element={<Navigate to={`/login?next=${encodeURIComponent(location.pathname + location.search + location.hash)}`} replace />}
        />
      </Routes>
    );
  }
  const operator = me.data.is_operator;
  return (
    <Shell username={me.data.username} operator={operator}>
      <Routes>
        <Route path="/" element={<DashboardPage />} />
        <Route path="/login" element={<SignedInAtLogin />} />
        <Route path="/availability" element={<AvailabilityPage />} />
        <Route path="/queue" element={<QueuePage />} />
        <Route path="/operator-queue" element={operator ? <OperatorQueuePage /> : <OperatorsOnly />} />
        <Route path="/reservations/:id" element={<ReservationPage />} />
        <Route path="/history" element={<HistoryPage />} />
        <Route path="/usage" element={<UsagePage />} />
        <Route path="/efficiency" element={<EfficiencyPage />} />
        <Route path="/volumes" element={<VolumesPage />} />
        <Route path="/secrets" element={<SecretsPage />} />
        <Route path="/tokens" element={<TokensPage />} />
        <Route path="/ssh-keys" element={<SshKeysPage />} />
        <Route path="/notifications" element={<NotificationsPage />} />
        <Route path="/webhooks" element={<WebhooksPage />} />
        <Route path="/fleet" element={operator ? <FleetPage /> : <OperatorsOnly />} />
        <Route path="/join-tokens" element={operator ? <JoinTokensPage /> : <OperatorsOnly />} />
        <Route path="/accounting" element={operator ? <AccountingPage /> : <OperatorsOnly />} />
        <Route path="*" element={<NotFound />} />
      </Routes>
    </Shell>
  );
}

function Shell({ username, operator, children }: { username: string; operator: boolean; children: React.ReactNode }) {
  const [opened, { toggle, close }] = useDisclosure();
  const location = useLocation();
  const navigate = useNavigate();
  const queryClient = useQueryClient();

  async function signOut() {
    await api.post("auth/logout/").catch(() => undefined);
    queryClient.clear();
    await queryClient.invalidateQueries({ queryKey: ["me"] });
    navigate("/login");
  }

  const links = operator ? [...TENANT_LINKS, ...OPERATOR_LINKS] : TENANT_LINKS;
  return (
    <>
    {/* First in the page, so the first Tab reaches it: past the header and the navigation to the page itself. */}
    <a
      href="#main"
      className="skip-link"
      onClick={(e) => {
        e.preventDefault();
        const main = document.getElementById("main");
        main?.focus();
        main?.scrollIntoView();
      }}
    >
      Skip to main content
    </a>
    <AppShell header={{ height: 56 }} navbar={{ width: 220, breakpoint: "sm", collapsed: { mobile: !opened } }} padding="md">
      <AppShell.Header>
        <Group h="100%" px="md" justify="space-between" wrap="nowrap">
          <Group gap="sm" wrap="nowrap">
            <Burger opened={opened} onClick={toggle} hiddenFrom="sm" size="sm" aria-label="Toggle navigation" />
            {/* The product's name, not a heading: each page's own title is its h1. */}
            <Link to="/" style={{ textDecoration: "none", color: "inherit" }}>
              <Text fw={700} size="lg">
                GPU control plane
              </Text>
            </Link>
          </Group>
          <Group gap="xs" wrap="nowrap">
            <NotificationBell />
            <ZoneToggle />
            <Text size="sm" visibleFrom="xs" data-testid="signed-in-as">
              {username}
              {operator ? " (operator)" : ""}
            </Text>
            <Button variant="default" size="xs" onClick={signOut}>
              Sign out
            </Button>
          </Group>
        </Group>
      </AppShell.Header>
      <AppShell.Navbar p="xs" component="nav" aria-label="Main">
        {links.map((l) => (
          <NavLink
            key={l.to}
            component={Link}
            to={l.to}
            label={l.label}
            active={l.to === "/" ? location.pathname === "/" : location.pathname.startsWith(l.to)}
            onClick={close}
          />
        ))}
      </AppShell.Navbar>
      <AppShell.Main id="main" tabIndex={-1}>
        <Suspense
          fallback={
            <Center p="xl">
              <Loader aria-label="Loading page" />
            </Center>
          }
        >
          {children}
        </Suspense>
      </AppShell.Main>
    </AppShell>
    </>
  );
}

/** Signed in but at /login (just signed in, or an old tab): on to the page that was asked for. */
function SignedInAtLogin() {
  const location = useLocation();
  return <Navigate to={safeNext(new URLSearchParams(location.search).get("next"))} replace />;
}

function OperatorsOnly() {
  return (
    <Stack>
      <Title order={1} size="h2">
        For operators only
      </Title>
      <Text>This page is for operators.</Text>
    </Stack>
  );
}

function NotFound() {
  return (
    <Stack>
      <Title order={1} size="h2">
        Page not found
      </Title>
      <Text>
        There is no page here.{" "}
        <Anchor component={Link} to="/">
          Back to the dashboard
        </Anchor>
        .
      </Text>
    </Stack>
  );
}
