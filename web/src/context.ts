// What every view is handed: the signed-in API client, who the user is, and navigation.
import { createContext } from "preact";
import { useContext } from "preact/hooks";
import type { Api } from "./api";
import type { Me } from "./types";

export interface AppContextValue {
  api: Api;
  me: Me;
  /** Goes to a console route (history API); `replace` does not add a history entry. */
  navigate: (path: string, replace?: boolean) => void;
}

export const AppContext = createContext<AppContextValue | null>(null);

export function useApp(): AppContextValue {
  const value = useContext(AppContext);
  if (!value) throw new Error("useApp outside the signed-in console");
  return value;
}
