// Every tool call waiting for a decision the user may take, across sessions: listed from
// GET /api/v1/approvals, refreshed whenever the approvals feed (SSE, for roles that approve)
// says something changed, and every REFRESH_MS otherwise.
import { createContext } from "preact";
import { useCallback, useContext, useEffect, useRef, useState } from "preact/hooks";
import type { Api } from "./api";
import { follow } from "./sse";
import type { Me, PendingApproval } from "./types";

const REFRESH_MS = 15_000;
const DEBOUNCE_MS = 150;

export interface PendingApprovals {
  pending: PendingApproval[];
  /** Whether the list has been read once (an empty list before that means nothing yet). */
  loaded: boolean;
  error: string;
  refresh: () => void;
  /** The pending entry of one call, if the user may decide it. */
  find: (spawnId: string, callId: string) => PendingApproval | undefined;
}

export const ApprovalsContext = createContext<PendingApprovals>({
  pending: [],
  loaded: false,
  error: "",
  refresh: () => undefined,
  find: () => undefined,
});

export function useApprovals(): PendingApprovals {
  return useContext(ApprovalsContext);
}

export function usePendingApprovals(api: Api, me: Me): PendingApprovals {
  const [pending, setPending] = useState<PendingApproval[]>([]);
  const [error, setError] = useState("");
  const [loaded, setLoaded] = useState(false);
  const timer = useRef<ReturnType<typeof setTimeout> | null>(null);

  const load = useCallback(async () => {
    try {
      setPending(await api.get<PendingApproval[]>("/api/v1/approvals"));
      setLoaded(true);
      setError("");
    } catch (exc) {
      setError(exc instanceof Error ? exc.message : String(exc));
    }
  }, [api]);

  const refresh = useCallback(() => {
    if (timer.current) clearTimeout(timer.current);
    timer.current = setTimeout(() => void load(), DEBOUNCE_MS);
  }, [load]);

  useEffect(() => {
    void load();
    const every = setInterval(() => void load(), REFRESH_MS);
    const stop = me.permissions.approve
      ? follow({
          url: "/api/v1/approvals/events",
          token: api.token,
          after: 0,
          onMessage: refresh,
        })
      : () => undefined;
    return () => {
      clearInterval(every);
      stop();
      if (timer.current) clearTimeout(timer.current);
    };
  }, [api, me, load, refresh]);

  const find = useCallback(
    (spawnId: string, callId: string) =>
      pending.find((p) => p.spawn_id === spawnId && p.call.id === callId),
    [pending],
  );
  return { pending, loaded, error, refresh, find };
}
