/// <reference types="vitest/config" />
import { defineConfig } from "vite";
import react from "@vitejs/plugin-react";
import { compression } from "vite-plugin-compression2";

// The API runs on Django; the dev server forwards /api (and /admin for convenience) to it so cookies stay
// same-origin, exactly as in production where Django serves the built app.
const backend = process.env.PORTAL_BACKEND ?? "http://127.0.0.1:8000";

export default defineConfig({
  // .br and .gz beside each compressible file, served as they are by controlplane/core/spa.py: the build pays
  // for maximum compression once instead of every request.
  plugins: [react(), compression({ algorithms: ["brotliCompress", "gzip"] })],
  server: {
    proxy: {
      "/api": { target: backend, changeOrigin: false },
      "/admin": { target: backend, changeOrigin: false },
    },
  },
  build: {
    outDir: "dist",
    emptyOutDir: true,
  },
  test: {
    environment: "node",
    include: ["src/**/*.test.ts"],
  },
});
