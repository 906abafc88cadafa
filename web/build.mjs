// Builds the console into coordinator/web/dist (the Python package ships that folder).
//
//   node build.mjs            build into ../coordinator/web/dist
//   node build.mjs --out DIR  build into DIR
//   node build.mjs --check    build in memory and compare with ../coordinator/web/dist: exit 1,
//                             naming each file that differs, when the shipped build is stale
//
// The output depends only on the sources and the locked packages (package-lock.json): no
// timestamps, no absolute paths, names without content hashes (index.html asks for each asset
// with `?v=<sha256 prefix>` so a browser never keeps a stale one).
import { createHash } from "node:crypto";
import { mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const shipped = join(here, "..", "coordinator", "web", "dist");

function argValue(flag) {
  const at = process.argv.indexOf(flag);
  return at === -1 ? undefined : process.argv[at + 1];
}

const digest = (bytes) => createHash("sha256").update(bytes).digest("hex").slice(0, 16);

async function bundle() {
  const result = await esbuild.build({
    absWorkingDir: here,
    entryPoints: { app: "src/main.tsx" },
    bundle: true,
    minify: true,
    format: "esm",
    target: ["es2022", "chrome110", "firefox115", "safari16"],
    jsx: "automatic",
    jsxImportSource: "preact",
    legalComments: "none",
    charset: "utf8",
    outdir: "out",
    write: false,
    metafile: false,
    logLevel: "warning",
  });
  const files = {};
  for (const file of result.outputFiles) {
    files[`assets/${relative(join(here, "out"), file.path)}`] = Buffer.from(file.contents);
  }
  return files;
}

async function build() {
  const files = await bundle();
  const version = (name) => digest(files[name]);
  const html = readFileSync(join(here, "index.html"), "utf8")
    .replace("%APP_CSS%", `/assets/app.css?v=${version("assets/app.css")}`)
    .replace("%APP_JS%", `/assets/app.js?v=${version("assets/app.js")}`);
  files["index.html"] = Buffer.from(html);
  const licence = readFileSync(join(here, "node_modules", "preact", "LICENSE"), "utf8");
  files["licenses.txt"] =
    Buffer.from(`The console bundles Preact (https://preactjs.com):\n\n${licence}`);
  return files;
}

function listFiles(root, prefix = "") {
  if (!existsSync(root)) return [];
  return readdirSync(root, { withFileTypes: true }).flatMap((entry) =>
    entry.isDirectory()
      ? listFiles(join(root, entry.name), `${prefix}${entry.name}/`)
      : [`${prefix}${entry.name}`],
  );
}

const files = await build();
if (process.argv.includes("--check")) {
  const present = new Set(listFiles(shipped));
  const problems = [];
  for (const [name, bytes] of Object.entries(files)) {
    if (!present.has(name)) problems.push(`missing: ${name}`);
    else if (!readFileSync(join(shipped, name)).equals(bytes)) problems.push(`differs: ${name}`);
    present.delete(name);
  }
  for (const name of present) problems.push(`not built from the sources: ${name}`);
  if (problems.length) {
    console.error(`coordinator/web/dist does not match web/ (run ./dev console):\n  ${problems.join("\n  ")}`);
    process.exit(1);
  }
  console.log(`coordinator/web/dist matches the sources (${Object.keys(files).length} files)`);
} else {
  const out = argValue("--out") ?? shipped;
  rmSync(out, { recursive: true, force: true });
  for (const [name, bytes] of Object.entries(files)) {
    mkdirSync(dirname(join(out, name)), { recursive: true });
    writeFileSync(join(out, name), bytes);
  }
  console.log(`built ${Object.keys(files).length} files into ${out}`);
}
