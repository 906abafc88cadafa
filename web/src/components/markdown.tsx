// A model's answer, rendered as the Markdown it is written in (headings, lists, tables, code),
// and sanitised: model output is untrusted. Raw HTML in it is shown as text, never parsed;
// images are left out (the page loads nothing from another host); links open apart, with
// rel="noopener noreferrer".
import DOMPurify from "dompurify";
import { Marked } from "marked";
import { useMemo } from "preact/hooks";

function escapeHtml(text: string): string {
  return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

const markdown = new Marked({
  gfm: true,
  breaks: true,
  renderer: {
    // Raw HTML the model wrote is text to read, not markup to run.
    html: ({ text }) => escapeHtml(text),
    // An image would load from wherever the model pointed: its text stands in for it.
    image: ({ text }) => escapeHtml(text),
  },
});

const purifier = DOMPurify();
purifier.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

/** The safe HTML of ``text``. */
export function renderMarkdown(text: string): string {
  const html = markdown.parse(text, { async: false }) as string;
  return purifier.sanitize(html, {
    FORBID_TAGS: ["img", "style", "form", "input", "button", "iframe", "object", "embed"],
    FORBID_ATTR: ["style"],
    ALLOWED_URI_REGEXP: /^(?:https?:|mailto:|#|\/)/i,
  });
}

export function Markdown({ text, testid }: { text: string; testid?: string }) {
  const html = useMemo(() => renderMarkdown(text), [text]);
  // eslint-disable-next-line react/no-danger -- sanitised just above
  return <div class="prose markdown" data-testid={testid} dangerouslySetInnerHTML={{ __html: html }} />;
}
